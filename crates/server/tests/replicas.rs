//! Several `serve` replicas with the same configuration and no coordination: `prefix-aware`
//! sends every prefix to the same instance from whichever replica it arrives at, whatever
//! order each replica lists the instances in (rendezvous hashing of the key on instance ids).
//! A client load split across the three, over real HTTP on 127.0.0.1.

mod support;

use http::StatusCode;
use prefix_router_core::{StrategyConfig, StrategyKind};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_aware_replicas_place_every_prefix_alike() {
    let ups = [
        Upstream::start("a", Mode::Echo, &[]).await,
        Upstream::start("b", Mode::Echo, &[]).await,
        Upstream::start("c", Mode::Echo, &[]).await,
        Upstream::start("d", Mode::Echo, &[]).await,
    ];
    let urls: Vec<String> = ups.iter().map(Upstream::url).collect();
    let mut replicas = Vec::new();
    for rotate in 0..3 {
        // Each replica lists the instances in another order.
        let mut order = urls.clone();
        order.rotate_left(rotate);
        let mut s = settings(&order);
        s.routing.strategy =
            StrategyConfig::new(StrategyKind::named("prefix-aware").expect("registered"));
        replicas.push(router(s).await);
    }
    let mut used = std::collections::BTreeSet::new();
    for doc in 0..40 {
        let prompt = format!("{} question {doc}", format!("document {doc} ").repeat(200));
        let mut homes = Vec::new();
        // The load is split: each replica gets this prefix once, in turn.
        for r in &replicas {
            let ans = complete(r.local_addr(), &prompt).await;
            assert_eq!(ans.status, StatusCode::OK);
            homes.push(ans.upstream());
        }
        assert!(
            homes.iter().all(|h| *h == homes[0]),
            "doc {doc}: replicas disagree: {homes:?}"
        );
        used.insert(homes[0].clone());
    }
    assert_eq!(
        used.len(),
        4,
        "40 prefixes over 4 instances use all of them: {used:?}"
    );
    for r in replicas {
        r.shutdown().await;
    }
}
