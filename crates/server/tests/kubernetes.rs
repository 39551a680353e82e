//! Kubernetes discovery against a fake API server over real HTTP on 127.0.0.1
//! (`support/kube_api.rs`): endpoints joining, ready and not-ready flips (a member not ready
//! drains a while and comes back with what the router knew of it), terminating endpoints
//! draining, a watch that breaks and resumes from its resourceVersion, a 410 Gone that forces a
//! new list, a deleted slice.

mod support;

use http::StatusCode;
use prefix_router_core::InstanceState;
use prefix_router_server::settings::KubernetesTarget;
use prefix_router_server::RunningRouter;
use support::kube_api::{slice, FakeApi};
use support::*;

fn members(r: &RunningRouter) -> Vec<(u16, InstanceState)> {
    let mut m: Vec<(u16, InstanceState)> = r
        .state()
        .fleet
        .snapshot()
        .instances()
        .iter()
        .map(|i| (i.url_port(), i.state()))
        .collect();
    m.sort_by_key(|x| x.0);
    m
}

/// Moves the member on `port` from one of `from` to `to`, as the admin API or the health
/// checker would.
fn move_member(r: &RunningRouter, port: u16, from: &[InstanceState], to: InstanceState) -> bool {
    let snapshot = r.state().fleet.snapshot();
    let inst = snapshot
        .instances()
        .iter()
        .find(|i| i.url_port() == port)
        .expect("a member on that port");
    prefix_router_server::membership::transition(r.state(), inst, from, to)
}

fn ports(r: &RunningRouter) -> Vec<u16> {
    members(r).into_iter().map(|m| m.0).collect()
}

fn target(api_server: String) -> KubernetesTarget {
    KubernetesTarget {
        service: "llm".into(),
        namespace: Some("ns".into()),
        port: "http".into(),
        scheme: "http".into(),
        model_label: Some("model".into()),
        api_server: Some(api_server),
        weight: 1,
        first_list_timeout: std::time::Duration::from_millis(300),
        unready_keep: std::time::Duration::from_secs(60),
        watch_retry_max: std::time::Duration::from_secs(60),
    }
}

/// A router whose instances are `api`'s Service, started once its first list is in.
async fn watching(api: &FakeApi) -> RunningRouter {
    watching_with(api, |_| {}).await
}

/// [`watching`], with the target `tweak`ed.
async fn watching_with(api: &FakeApi, tweak: impl FnOnce(&mut KubernetesTarget)) -> RunningRouter {
    let mut s = settings(&[]);
    s.health.wait_for_first_check = false;
    let mut t = target(api.url());
    t.first_list_timeout = std::time::Duration::from_secs(10);
    tweak(&mut t);
    s.discovery.kubernetes = Some(t);
    router(s).await
}

/// Two stand-in engines, `a` and `b`, each the ready endpoint of a slice of its own.
async fn two_ready() -> (Upstream, Upstream, FakeApi) {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let api = FakeApi::start().await;
    api.put(slice("llm-a", a.addr.port(), true, false));
    api.put(slice("llm-b", b.addr.port(), true, false));
    (a, b, api)
}

async fn served_by(r: &RunningRouter, i: usize) -> String {
    let ans = post(
        r.local_addr(),
        "/v1/completions",
        &[],
        format!(r#"{{"model":"mock-llama","prompt":"request {i}"}}"#),
    )
    .await;
    assert_eq!(ans.status, StatusCode::OK);
    ans.upstream()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_drive_the_fleet_through_watch_breaks_and_410s() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let b = Upstream::start("b", Mode::Echo, &[]).await;
    let c = Upstream::start("c", Mode::Echo, &[]).await;
    let (pa, pb, pc) = (a.addr.port(), b.addr.port(), c.addr.port());
    let api = FakeApi::start().await;
    api.put(slice("llm-a", pa, true, false));
    api.put(slice("llm-b", pb, false, false));

    let r = watching(&api).await;
    use InstanceState::*;
    // The first list is in before the router serves: only the ready endpoint.
    let first = members(&r);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].0, pa);
    assert_eq!(api.lists(), 1);
    assert!(
        api.selectors()
            .iter()
            .all(|s| s == "kubernetes.io/service-name=llm"),
        "{:?}",
        api.selectors()
    );
    let snapshot = r.state().fleet.snapshot();
    let a_inst = &snapshot.instances()[0];
    assert_eq!(
        a_inst.spec().models,
        vec!["mock-llama".to_string()],
        "the model label"
    );
    assert_eq!(served_by(&r, 0).await, "a");

    // b turns ready: it joins.
    api.put(slice("llm-b", pb, true, false));
    eventually("b joins", || members(&r).len() == 2).await;

    // a terminates: it drains; requests go to b only.
    let before_break = api.put(slice("llm-a", pa, false, true));
    eventually("a drains", || {
        members(&r).iter().any(|&(p, st)| p == pa && st == Draining)
    })
    .await;
    for i in 0..4 {
        assert_eq!(served_by(&r, i).await, "b", "request {i}");
    }

    // The watch breaks; a change made meanwhile arrives when it resumes from its version,
    // without a new list.
    let watches = api.watch_versions().len();
    api.break_watch();
    let rv = api.put(slice("llm-c", pc, true, false));
    eventually("c joins after the watch resumed", || {
        members(&r).iter().any(|&(p, _)| p == pc)
    })
    .await;
    assert_eq!(
        api.lists(),
        1,
        "a broken watch resumes; it does not list again"
    );
    let versions = api.watch_versions();
    assert!(versions.len() > watches, "{versions:?}");
    let resumed: u64 = versions[watches].parse().expect("a version");
    assert_eq!(
        resumed, before_break,
        "resumed from the last version it saw (the change at {rv} came after)"
    );

    // 410 Gone: the watcher lists again, and finds what no event told it (a's slice gone).
    api.forget("llm-a");
    api.gone_on_next_watch();
    api.break_watch();
    eventually("a new list after 410 Gone", || api.lists() >= 2).await;
    let mut both = vec![pb, pc];
    both.sort_unstable();
    eventually("b and c after the new list", || ports(&r) == both).await;

    // b turns not-ready: it drains (kept a while, in case it comes back). Its slice deleted,
    // it leaves.
    api.put(slice("llm-b", pb, false, false));
    eventually("b drains when not ready", || {
        members(&r).contains(&(pb, Draining))
    })
    .await;
    api.delete("llm-b");
    eventually("c alone", || {
        members(&r).len() == 1 && members(&r)[0].0 == pc
    })
    .await;
    assert_eq!(served_by(&r, 9).await, "c");
    r.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_api_server_does_not_stop_the_router() {
    let a = Upstream::start("a", Mode::Echo, &[]).await;
    let mut s = settings(&[a.url()]);
    s.discovery.kubernetes = Some(target(dead_url().await));
    let started = std::time::Instant::now();
    let r = router(s).await;
    // It waited for a first list (first_list_timeout_ms), then serves the static instances.
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(served_by(&r, 0).await, "a");
    r.shutdown().await;
}

/// A new pod at the address of one that terminated (`hostNetwork` pods share their node's IP),
/// with no list between in which the address was gone: it takes requests again, as a new
/// instance. A drain set through the admin API is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_ready_again_after_terminating_is_not_left_draining() {
    let (a, b, api) = two_ready().await;
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let r = watching(&api).await;
    use InstanceState::*;
    let mut both = vec![(pa, Healthy), (pb, Healthy)];
    both.sort_by_key(|x| x.0);
    assert_eq!(members(&r), both);
    // b is drained by hand (the admin API's drain).
    assert!(move_member(
        &r,
        pb,
        &prefix_router_server::membership::DRAINABLE,
        Draining
    ));
    // a's pod terminates; its replacement comes up at the same address.
    api.put(slice("llm-a", pa, false, true));
    eventually("a drains", || members(&r).contains(&(pa, Draining))).await;
    api.put(slice("llm-a", pa, true, false));
    eventually("a takes requests again", || {
        members(&r).contains(&(pa, Healthy))
    })
    .await;
    assert_eq!(served_by(&r, 0).await, "a");
    // b's drain was not the watch's: it stays.
    assert!(members(&r).contains(&(pb, Draining)), "{:?}", members(&r));
    r.shutdown().await;
}

/// A prompt `i` long enough to be blocks of the cache-aware index (2 KiB).
fn long_prompt(i: usize) -> String {
    let text: String = (0..200).map(|w| format!("doc{i} w{w} ")).collect();
    format!(r#"{{"model":"mock-llama","prompt":"{text}"}}"#)
}

async fn sent(r: &RunningRouter, body: &str) -> (String, String) {
    let ans = post(r.local_addr(), "/v1/completions", &[], body.to_string()).await;
    assert_eq!(ans.status, StatusCode::OK);
    (ans.upstream(), ans.header("x-prefix-router-decision"))
}

/// A member whose readiness probe fails for a while (an engine busy, not gone) drains and comes
/// back as the same instance: what cache-aware knew of its cache stands (its prompt is still a
/// `cache_hit` there), and a request it held meanwhile still counts on it. Not ready past
/// `unready_keep_ms`, it leaves, and comes back as a new instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_flap_keeps_the_member_and_what_the_router_knew_of_it() {
    let (a, b, api) = two_ready().await;
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let r = watching_with(&api, |t| {
        t.unready_keep = std::time::Duration::from_millis(4000);
    })
    .await;
    use InstanceState::*;
    eventually("both members", || members(&r).len() == 2).await;
    let prompt = long_prompt(1);
    let (home, _) = sent(&r, &prompt).await;
    assert_eq!(sent(&r, &prompt).await, (home.clone(), "cache_hit".into()));
    let (slice_name, port, up) = if home == "a" {
        ("llm-a", pa, &a)
    } else {
        ("llm-b", pb, &b)
    };
    // A request held on the home while it flaps (the same prompt: it goes home).
    let held = {
        let (addr, body) = (r.local_addr(), prompt.clone());
        tokio::spawn(
            async move { post(addr, "/v1/completions", &[("x-test-hold", "1")], body).await },
        )
    };
    eventually("a request held on the home", || up.held() == 1).await;
    let in_flight = |r: &RunningRouter| {
        r.state()
            .fleet
            .snapshot()
            .instances()
            .iter()
            .find(|i| i.url_port() == port)
            .map(|i| i.in_flight())
    };
    assert_eq!(in_flight(&r), Some(1));
    api.put(slice(slice_name, port, false, false));
    eventually("the home drains while not ready", || {
        members(&r).contains(&(port, Draining))
    })
    .await;
    assert_eq!(in_flight(&r), Some(1), "its request still counts on it");
    api.put(slice(slice_name, port, true, false));
    eventually("the home takes requests again", || {
        members(&r).contains(&(port, Healthy))
    })
    .await;
    assert_eq!(
        in_flight(&r),
        Some(1),
        "the same member, its request still counted"
    );
    assert_eq!(
        sent(&r, &prompt).await,
        (home.clone(), "cache_hit".into()),
        "what the router knew of its cache stands"
    );
    up.release(1);
    assert_eq!(held.await.expect("held").status, StatusCode::OK);
    // Not ready past unready_keep_ms: it leaves without another event.
    api.put(slice(slice_name, port, false, false));
    eventually("the home leaves once its time is out", || {
        members(&r).iter().all(|&(p, _)| p != port)
    })
    .await;
    api.put(slice(slice_name, port, true, false));
    eventually("it comes back", || members(&r).len() == 2).await;
    // A new instance: the prompt is not known to be cached there.
    let (_, decision) = sent(&r, &prompt).await;
    assert_ne!(decision, "cache_hit".to_string());
    r.shutdown().await;
}

/// A member that was not healthy when it stopped being ready (here: ejected) is checked as a new
/// instance when it is ready again, rather than taking requests unchecked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_ejected_before_its_flap_is_checked_again() {
    let (a, b, api) = two_ready().await;
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let mut s = settings(&[]);
    s.health.wait_for_first_check = false;
    s.health.active = true;
    // One probe at the start, the next a minute later: a member checked anew stays unchecked.
    s.health.interval = std::time::Duration::from_secs(60);
    let mut t = target(api.url());
    t.first_list_timeout = std::time::Duration::from_secs(10);
    s.discovery.kubernetes = Some(t);
    let r = router(s).await;
    use InstanceState::*;
    let mut both = vec![(pa, Healthy), (pb, Healthy)];
    both.sort_by_key(|x| x.0);
    eventually("both checked", || members(&r) == both).await;
    assert!(move_member(&r, pb, &[Healthy], Ejected));
    api.put(slice("llm-b", pb, false, false));
    eventually("b drains", || members(&r).contains(&(pb, Draining))).await;
    api.put(slice("llm-b", pb, true, false));
    eventually("b back, to be checked", || {
        members(&r).contains(&(pb, Unknown))
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(members(&r).contains(&(pb, Unknown)), "{:?}", members(&r));
    r.shutdown().await;
}

/// An operator's drain made while the watch has the member draining for being unready holds:
/// ready again, the member stays drained until the operator activates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operators_drain_during_a_flap_is_not_undone() {
    use http::Method;
    let (_a, b, api) = two_ready().await;
    let pb = b.addr.port();
    let mut s = settings(&[]);
    s.health.wait_for_first_check = false;
    s.admin =
        prefix_router_server::settings::Admin::on("127.0.0.1:0".parse().expect("addr"), "t0k");
    let mut t = target(api.url());
    t.first_list_timeout = std::time::Duration::from_secs(10);
    s.discovery.kubernetes = Some(t);
    let r = router(s).await;
    let admin = r.admin_addr().expect("admin listener");
    use InstanceState::*;
    eventually("both members", || members(&r).len() == 2).await;
    api.put(slice("llm-b", pb, false, false));
    eventually("b drains", || members(&r).contains(&(pb, Draining))).await;
    let body = format!(r#"{{"url":"{}"}}"#, b.url());
    let drained = admin_call(
        admin,
        Method::POST,
        "/admin/instances/drain",
        Some("t0k"),
        &body,
    )
    .await;
    assert_eq!(drained.status, StatusCode::OK);
    api.put(slice("llm-b", pb, true, false));
    // A third endpoint after it: once it joins, the watch has applied b's change too (events
    // come in order).
    let c = Upstream::start("c", Mode::Echo, &[]).await;
    let pc = c.addr.port();
    api.put(slice("llm-c", pc, true, false));
    eventually("c joins", || members(&r).iter().any(|&(p, _)| p == pc)).await;
    assert!(members(&r).contains(&(pb, Draining)), "{:?}", members(&r));
    let activated = admin_call(
        admin,
        Method::POST,
        "/admin/instances/activate",
        Some("t0k"),
        &body,
    )
    .await;
    assert_eq!(activated.status, StatusCode::OK);
    eventually("b activated", || members(&r).contains(&(pb, Healthy))).await;
    r.shutdown().await;
}

/// A watch that fails and then resumes from its version sends no event until something
/// changes: an unready member's time must run out anyway, once the watch has gone
/// `watch_retry_max` without failing (it stayed draining for good while nothing changed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unready_member_leaves_after_a_watch_outage_that_ends_without_news() {
    let (a, b, api) = two_ready().await;
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let keep = std::time::Duration::from_secs(2);
    let r = watching_with(&api, |t| {
        t.unready_keep = keep;
        // Longer than the watcher's waits between the tries below (0.8 and 1.6 s, jitter
        // included up to twice that).
        t.watch_retry_max = std::time::Duration::from_secs(5);
    })
    .await;
    api.put(slice("llm-b", pb, false, false));
    eventually("b drains", || {
        members(&r).contains(&(pb, InstanceState::Draining))
    })
    .await;
    // Three refused watches (three errors, about 0.8 and 1.6 s apart with the watcher's
    // backoff), then a watch that opens and has nothing to say.
    let watches = api.watch_versions().len();
    api.fail_watches(3);
    api.break_watch();
    let long = std::time::Duration::from_secs(20);
    eventually_for("three refused watches", long, || {
        api.watch_versions().len() >= watches + 3
    })
    .await;
    // While it fails, b's time does not run out (`keep` since it drained is past by now).
    assert!(
        members(&r).contains(&(pb, InstanceState::Draining)),
        "{:?}",
        members(&r)
    );
    eventually_for("the watch is open again", long, || {
        api.watch_versions().len() >= watches + 4
    })
    .await;
    eventually_for("b leaves", std::time::Duration::from_secs(10), || {
        ports(&r) == [pa]
    })
    .await;
    r.shutdown().await;
}

/// An endpoint first seen terminating (a pod on its way out when the router starts, or when its
/// slice first lists it) never joins: added and then drained, it could take a request in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_first_seen_terminating_never_joins() {
    let (a, b, api) = two_ready().await;
    let c = Upstream::start("c", Mode::Echo, &[]).await;
    let (pa, pb, pc) = (a.addr.port(), b.addr.port(), c.addr.port());
    api.put(slice("llm-c", pc, false, true));
    let r = watching(&api).await;
    let mut both = vec![pa, pb];
    both.sort_unstable();
    assert_eq!(ports(&r), both, "the first list");
    // Listed again with a change after it (events apply in order): still not a member.
    api.put(slice("llm-c", pc, false, true));
    api.put(slice("llm-b", pb, false, false));
    eventually("b drains", || {
        members(&r).contains(&(pb, InstanceState::Draining))
    })
    .await;
    assert!(!ports(&r).contains(&pc), "{:?}", members(&r));
    // Ready later (a new pod at that address): it joins.
    api.put(slice("llm-c", pc, true, false));
    eventually("c joins once ready", || ports(&r).contains(&pc)).await;
    r.shutdown().await;
}
