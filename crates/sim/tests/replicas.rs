//! Three router replicas in the simulator, the requests dealt among them: `kv-aware` replicas,
//! reading the same engines' KV events, keep each prefix on one instance as one router does;
//! `cache-aware` replicas, each learning from its own third of the traffic, split more of them.
//! Long-context, 7 instances of the default preset, 1,800 requests over its 600 documents (three
//! a document: most second requests come soon after the first).

mod support;

use prefix_router_sim::{RouterModel, ScrapeModel, SimConfig};
use prefix_router_workload::{generators, Affinity, Arrival, Request, WorkloadKind, WorkloadSpec};

fn workload() -> Vec<Request> {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
    spec.requests = 1_800;
    spec.arrival = Arrival::Closed { clients: 32 };
    generators::generate(&spec).collect()
}

/// Each prefix's requests on its home instance, and the busiest instance over the mean.
fn placement(requests: &[Request], strategy: &str, routers: RouterModel) -> Affinity {
    let config = SimConfig {
        routers,
        ..support::config("llama-3.1-70b-h100x8", strategy, 32, 1)
    };
    let out = support::run_first(requests, &config);
    Affinity::of(
        requests.iter().zip(out.records.iter().map(|r| r.instance)),
        7,
    )
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "needs a release build: run `cargo test --release -p prefix-router-sim --test replicas`"
)]
fn kv_aware_replicas_keep_each_prefix_on_one_instance() {
    let requests = workload();
    let three = RouterModel {
        replicas: 3,
        scrape: None,
    };
    let scraped = RouterModel {
        replicas: 3,
        scrape: Some(ScrapeModel::default()),
    };
    let one = placement(&requests, "kv-aware", RouterModel::default());
    let kv = placement(&requests, "kv-aware", three);
    let kv_scraped = placement(&requests, "kv-aware", scraped);
    let ca = placement(&requests, "cache-aware", three);
    let report = format!(
        "kv-aware: one router {:.3}, three {:.3} (busiest {:.2}x), scraped {:.3} ({:.2}x); \
         cache-aware three {:.3}",
        one.on_home,
        kv.on_home,
        kv.max_share_over_mean,
        kv_scraped.on_home,
        kv_scraped.max_share_over_mean,
        ca.on_home
    );
    eprintln!("{report}");
    for a in [kv, kv_scraped] {
        assert!(a.on_home >= 0.95, "{report}");
        assert!(
            a.on_home >= one.on_home - 0.02,
            "as with one router: {report}"
        );
        assert!(a.max_share_over_mean <= 1.25, "{report}");
    }
    assert!(kv.on_home > ca.on_home + 0.05, "{report}");
}
