use super::*;
use crate::simulate::{engine_config, routing_keys};
use crate::testkit::{config, shared_docs, PRESET};
use prefix_router_core::Strategy as CoreStrategy;
use prefix_router_core::{StrategyConfig, StrategyKind};
use prefix_router_workload::ScaleEvent;
use proptest::prelude::*;

fn run(w: &crate::SimWorkload, c: &SimConfig, kind: StrategyKind) -> RunOutcome {
    let strategy = StrategyConfig::new(kind).build().expect("strategy builds");
    run_on(w, c, &[strategy])
}

#[test]
fn drained_instances_get_nothing_after_the_drain() {
    let w = shared_docs(500, 20, 25.0, 11);
    let mut c = config(4, &[]);
    c.scale = vec![ScaleEvent {
        at_s: 8.0,
        delta: -2,
    }];
    for kind in StrategyKind::all() {
        let out = run(&w, &c, kind);
        for r in &out.records {
            if r.start_s > 8.0 {
                assert!(
                    r.instance < 2,
                    "{kind:?}: request at {} went to drained sim-{}",
                    r.start_s,
                    r.instance
                );
            }
        }
    }
}

#[test]
fn added_instances_get_work_only_after_they_exist() {
    let w = shared_docs(500, 20, 25.0, 12);
    let mut c = config(2, &[]);
    c.scale = vec![ScaleEvent {
        at_s: 6.0,
        delta: 1,
    }];
    let out = run(
        &w,
        &c,
        StrategyKind::named("round-robin").expect("registered"),
    );
    assert_eq!(out.dispatched.len(), 3);
    assert!(out.dispatched[2] > 0);
    assert!(out
        .records
        .iter()
        .filter(|r| r.instance == 2)
        .all(|r| r.start_s >= 6.0));
}

fn run_on(w: &crate::SimWorkload, c: &SimConfig, replicas: &[Arc<dyn CoreStrategy>]) -> RunOutcome {
    let engine = engine_config(PRESET).expect("test preset exists");
    let keys = routing_keys(&w.requests, c).expect("keys");
    let inputs = RunInputs {
        requests: &w.requests,
        keys: &keys,
        engine: &engine,
        config: c,
        chains: None,
    };
    run_replicas(inputs, replicas, &mut |_| {}).expect("run completes")
}

#[test]
fn prefix_aware_replicas_route_every_request_as_one_router_does() {
    let w = shared_docs(400, 20, 40.0, 21);
    let kind = StrategyKind::named("prefix-aware").expect("registered");
    let build = |n: usize| -> Vec<Arc<dyn CoreStrategy>> {
        (0..n)
            .map(|_| StrategyConfig::new(kind).build().expect("builds"))
            .collect()
    };
    let c = config(5, &[]);
    let one = run_on(&w, &c, &build(1));
    let mut three = c.clone();
    three.routers.replicas = 3;
    let split = run_on(&w, &three, &build(3));
    let at = |o: &RunOutcome| o.records.iter().map(|r| r.instance).collect::<Vec<_>>();
    assert_eq!(at(&one), at(&split), "rendezvous needs no coordination");
}

#[test]
fn replicas_read_what_the_engines_hold_of_the_others_and_a_late_reading_is_unknown() {
    use crate::routers::{RouterModel, ScrapeModel};
    use prefix_router_core::strategies::recording::{Call, Pick, Recording};
    // Three replicas that send everything to the first instance: each sees the others'
    // requests there only through the scrape.
    let others_seen = |scrape: Option<ScrapeModel>| {
        let w = shared_docs(300, 10, 60.0, 22);
        let mut c = config(3, &[]);
        c.routers = RouterModel {
            replicas: 3,
            scrape,
        };
        let recorders: Vec<Arc<Recording>> = (0..3)
            .map(|_| Arc::new(Recording::new(Pick::First)))
            .collect();
        let replicas: Vec<Arc<dyn CoreStrategy>> = recorders
            .iter()
            .map(|r| Arc::clone(r) as Arc<dyn CoreStrategy>)
            .collect();
        let out = run_on(&w, &c, &replicas);
        assert!(out.records.iter().all(|r| r.instance == 0));
        let (mut known, mut busy, mut all) = (0, 0, 0);
        for r in &recorders {
            for call in r.take() {
                if let Call::Dispatched { others, .. } = call {
                    all += 1;
                    known += usize::from(others.is_some());
                    busy += usize::from(others.is_some_and(|q| q.total() > 0));
                }
            }
        }
        assert_eq!(all, 300);
        (known, busy)
    };
    assert_eq!(others_seen(None), (0, 0), "not scraped: unknown");
    let fresh = ScrapeModel {
        interval_s: 0.05,
        delay_s: 0.005,
        stale_after_s: 0.2,
    };
    let (known, busy) = others_seen(Some(fresh));
    assert!(known > 250, "every reading is fresh: {known} of 300");
    assert!(busy > 100, "the others' requests show: {busy} of 300");
    // Each reading arrives after it went stale: unknown, never an idle engine.
    let late = ScrapeModel {
        delay_s: 0.5,
        ..fresh
    };
    assert_eq!(others_seen(Some(late)), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn every_request_is_served_once_in_time_order(
        n in 1usize..120,
        docs in 1u64..15,
        rate in 1.0f64..200.0,
        instances in 1u32..6,
        kind in 0usize..4,
        seed in 0u64..1000,
    ) {
        let w = shared_docs(n, docs, rate, seed);
        let c = config(instances, &[]);
        let out = run(&w, &c, StrategyKind::all().nth(kind).expect("kind"));
        prop_assert_eq!(out.dispatched.iter().sum::<u64>(), n as u64);
        prop_assert_eq!(out.decisions.values().sum::<u64>(), n as u64);
        for (r, q) in out.records.iter().zip(&w.requests) {
            prop_assert!(r.start_s == q.arrival_s);
            prop_assert!(r.start_s <= r.first_token_s && r.first_token_s <= r.finish_s);
            prop_assert!(r.cached_tokens <= q.prompt_tokens());
            prop_assert!((r.instance as usize) < out.dispatched.len());
        }
    }
}

/// prefix-aware's choices, and every membership change it is told.
#[derive(Debug)]
struct Watched {
    inner: Arc<dyn CoreStrategy>,
    told: std::sync::Mutex<Vec<(String, prefix_router_core::MembershipChange)>>,
}

impl CoreStrategy for Watched {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn select(
        &self,
        req: &prefix_router_core::RouteRequest<'_>,
        fleet: &prefix_router_core::FleetSnapshot,
        rng: &mut prefix_router_core::RouteRng,
    ) -> Result<prefix_router_core::Decision, prefix_router_core::RouteError> {
        self.inner.select(req, fleet, rng)
    }
    fn membership(
        &self,
        instance: &prefix_router_core::InstanceId,
        change: prefix_router_core::MembershipChange,
        now: f64,
    ) {
        if let Ok(mut t) = self.told.lock() {
            t.push((instance.as_str().to_string(), change));
        }
        self.inner.membership(instance, change, now);
    }
}

/// An instance drained while it is still warming (its prewarm replays in flight) is removed
/// once they end, and the strategies hear it: only a workload request's end used to check, and
/// none comes to an instance drained before it took any.
#[test]
fn an_instance_drained_while_warming_is_removed_when_its_replays_end() {
    use prefix_router_core::prewarm::PrewarmConfig;
    use prefix_router_core::MembershipChange;
    let w = shared_docs(400, 40, 60.0, 31);
    let mut c = config(2, &[]);
    c.prewarm = Some(PrewarmConfig::default());
    c.scale = vec![
        ScaleEvent {
            at_s: 3.0,
            delta: 1,
        },
        ScaleEvent {
            at_s: 3.001,
            delta: -1,
        },
    ];
    let watched = Arc::new(Watched {
        inner: StrategyConfig::new(StrategyKind::named("prefix-aware").expect("registered"))
            .build()
            .expect("builds"),
        told: Default::default(),
    });
    let out = run_on(&w, &c, &[Arc::clone(&watched) as Arc<dyn CoreStrategy>]);
    assert_eq!(out.dispatched.len(), 3);
    let told = watched.told.lock().map(|t| t.clone()).unwrap_or_default();
    let of_new: Vec<MembershipChange> = told
        .iter()
        .filter(|(id, _)| id == "sim-2")
        .map(|(_, c)| *c)
        .collect();
    // Joined and held out to warm (ejected from routing), drained, then removed.
    assert!(of_new.contains(&MembershipChange::Ejected), "{told:?}");
    assert!(of_new.contains(&MembershipChange::Draining), "{told:?}");
    assert_eq!(of_new.last(), Some(&MembershipChange::Removed), "{told:?}");
}
