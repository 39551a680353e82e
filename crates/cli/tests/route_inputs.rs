//! The simulator and the server route the same requests from the same inputs: what the
//! simulator extracts from a request (its chat body rendered only as far as routing reads) is
//! what the server extracts from the body `bench` sends over HTTP, for every built-in workload;
//! and both go through `prefix_router_core::dispatch`, so the same inputs and feedback give the
//! same decisions (checked here for cache-aware, whose decisions depend on all of them).

use std::sync::Arc;

use prefix_router_core::extract::chat_route;
use prefix_router_core::{
    dispatch, End, Fleet, InstanceSpec, KeyOptions, PrefixLength, RequestInfo, RouteRequest,
    RouteRng, Strategy, StrategyConfig, StrategyKind, Usage,
};
use prefix_router_loadgen::schedule::request_body;
use prefix_router_sim::run::route_info;
use prefix_router_workload::{generators, WorkloadKind, WorkloadSpec};
use rand::SeedableRng;

fn cache_aware() -> Arc<dyn Strategy> {
    StrategyConfig::new(StrategyKind::named("cache-aware").expect("registered"))
        .build()
        .expect("builds")
}

fn route(info: &RequestInfo, i: usize) -> RouteRequest<'_> {
    RouteRequest {
        key: Some(info.key),
        chain: &info.chain.blocks,
        prompt_units: info.chain.units,
        model: None,
        now: i as f64,
        tokens: None,
        whole_answer: false,
    }
}

#[test]
fn simulator_and_server_see_the_same_route_inputs_and_decide_alike() {
    let strategy = cache_aware();
    let opts = KeyOptions {
        prefix_length: PrefixLength::new(1024).expect("valid"),
        chain: strategy.chain_spec(),
    };
    let specs = (0..5)
        .map(|i| InstanceSpec::from_url(format!("http://127.0.0.1:{}", 8001 + i)))
        .collect::<Vec<_>>();
    for kind in WorkloadKind::ALL {
        let mut spec = WorkloadSpec::default_for(kind);
        spec.requests = 120;
        let requests: Vec<_> = generators::generate(&spec).collect();
        let (sim, server) = (cache_aware(), cache_aware());
        let (sim_fleet, server_fleet) = (Fleet::new(specs.clone()), Fleet::new(specs.clone()));
        let mut rng = (RouteRng::seed_from_u64(3), RouteRng::seed_from_u64(3));
        for (i, r) in requests.iter().enumerate() {
            let a = route_info(r, &opts).expect("the simulator extracts");
            let b =
                chat_route(request_body(r, false).as_bytes(), &opts).expect("the server extracts");
            assert_eq!(a.key, b.key, "{kind}: request {i}: key");
            assert_eq!(a.chain, b.chain, "{kind}: request {i}: chain");
            assert_eq!(a.model, b.model, "{kind}: request {i}: model");
            let da =
                dispatch(&sim, &route(&a, i), &sim_fleet.snapshot(), &mut rng.0).expect("routes");
            let db = dispatch(&server, &route(&b, i), &server_fleet.snapshot(), &mut rng.1)
                .expect("routes");
            assert_eq!(
                (da.index, &da.reason),
                (db.index, &db.reason),
                "{kind}: request {i}"
            );
            let usage = Some(Usage {
                prompt_tokens: r.prompt_tokens(),
                cached_tokens: Some(0),
            });
            for mut t in [da.ticket, db.ticket] {
                t.first_token(i as f64 + 0.1);
                t.finish(End::Finished { usage }, i as f64 + 0.5);
            }
        }
    }
}
