//! Property tests of the routing strategies: stability of rendezvous placement under scaling,
//! load bounds, eligibility and seeded determinism.

use prefix_router_core::strategies::PrefixAware;
use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{
    ConcurrencyThreshold, Fleet, FleetSnapshot, InstanceSpec, InstanceState, KeyHash, Reason,
    RouteError, RouteRequest, RouteRng, Strategy, StrategyConfig, StrategyKind,
};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

const KEYS: u64 = 100_000;

fn spec(i: usize) -> InstanceSpec {
    InstanceSpec::from_url(format!("http://10.1.{}.{}:8000", i / 256, i % 256))
}

fn prefix_aware(threshold: u64, overflow: OverflowPolicy, balance: Option<f64>) -> PrefixAware {
    let t = ConcurrencyThreshold::new(threshold).unwrap_or(ConcurrencyThreshold::MIN);
    match PrefixAware::new(t, overflow, balance) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn key(i: u64) -> KeyHash {
    KeyHash::new(None, &i.to_le_bytes())
}

fn placement(s: &PrefixAware, snap: &FleetSnapshot, rng: &mut RouteRng, k: KeyHash) -> String {
    match s.select(
        &RouteRequest {
            key: Some(k),
            model: None,
            ..RouteRequest::keyed(None, None)
        },
        snap,
        rng,
    ) {
        Ok(d) => snap.instances()[d.index].id().to_string(),
        Err(e) => panic!("{e}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]

    #[test]
    fn same_key_same_instance_on_independent_fleets(n in 2usize..=32, seed in any::<u64>()) {
        let specs: Vec<InstanceSpec> = (0..n).map(spec).collect();
        let mut reversed = specs.clone();
        reversed.reverse();
        let a = Fleet::new(specs).snapshot();
        let b = Fleet::new(reversed).snapshot();
        let s = prefix_aware(32, OverflowPolicy::NextInOrder, None);
        let mut rng = RouteRng::seed_from_u64(seed);
        for i in 0..KEYS / 10 {
            let k = key(i ^ seed);
            prop_assert_eq!(placement(&s, &a, &mut rng, k), placement(&s, &b, &mut rng, k));
        }
    }

    #[test]
    fn adding_one_instance_moves_about_one_in_n_plus_one_all_to_it(n in 2usize..=32) {
        let before = Fleet::new((0..n).map(spec).collect()).snapshot();
        let after = Fleet::new((0..=n).map(spec).collect()).snapshot();
        let new_id = spec(n).id;
        let s = prefix_aware(32, OverflowPolicy::NextInOrder, None);
        let mut rng = RouteRng::seed_from_u64(1);
        let mut moved = 0u64;
        for i in 0..KEYS {
            let (x, y) = (placement(&s, &before, &mut rng, key(i)), placement(&s, &after, &mut rng, key(i)));
            if x != y {
                prop_assert_eq!(&y, &new_id, "a key moved to an old instance");
                moved += 1;
            }
        }
        let expected = KEYS as f64 / (n as f64 + 1.0);
        prop_assert!((0.5 * expected..=1.5 * expected).contains(&(moved as f64)), "moved {moved}, expected ~{expected}");
    }

    #[test]
    fn removing_one_instance_moves_only_its_keys(n in 3usize..=32, gone in 0usize..32) {
        let gone = gone % n;
        let before = Fleet::new((0..n).map(spec).collect()).snapshot();
        let after = Fleet::new((0..n).filter(|&i| i != gone).map(spec).collect()).snapshot();
        let gone_id = spec(gone).id;
        let s = prefix_aware(32, OverflowPolicy::NextInOrder, None);
        let mut rng = RouteRng::seed_from_u64(2);
        for i in 0..KEYS / 4 {
            let (x, y) = (placement(&s, &before, &mut rng, key(i)), placement(&s, &after, &mut rng, key(i)));
            prop_assert!(x == y || x == gone_id, "key {i} moved from {x} to {y}");
        }
    }

    #[test]
    fn with_free_capacity_nothing_goes_to_a_full_instance(
        n in 2usize..=16,
        threshold in 1u64..=8,
        loads in proptest::collection::vec(0u32..12, 16),
        least in any::<bool>(),
        balance in proptest::option::of(1.1f64..3.0),
        seed in any::<u64>(),
    ) {
        let snap = Fleet::new((0..n).map(spec).collect()).snapshot();
        for (inst, &l) in snap.instances().iter().zip(&loads) {
            for _ in 0..l { inst.acquire(); }
        }
        let policy = if least { OverflowPolicy::LeastOutstanding } else { OverflowPolicy::NextInOrder };
        let s = prefix_aware(threshold, policy, balance);
        let free = snap.instances().iter().any(|i| u64::from(i.in_flight()) < threshold);
        let mut rng = RouteRng::seed_from_u64(seed);
        for i in 0..2_000 {
            let d = s.select(&RouteRequest { key: Some(key(i)), model: None, ..RouteRequest::keyed(None, None) }, &snap, &mut rng);
            let d = d.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let load = u64::from(snap.instances()[d.index].in_flight());
            if free {
                prop_assert!(load < threshold, "chose an instance at {load} >= threshold {threshold} ({:?})", d.reason);
            }
            if matches!(d.reason, Reason::Preferred) {
                prop_assert_eq!(Some(d.index), s.preferred(key(i), &snap, None));
            }
        }
    }

    #[test]
    fn ineligible_draining_and_ejected_are_never_chosen(seed in any::<u64>(), states in proptest::collection::vec(0u8..4, 8)) {
        let specs: Vec<InstanceSpec> = (0..8)
            .map(|i| {
                let mut s = spec(i);
                if i % 3 == 0 { s.models = vec!["other".into()]; }
                s
            })
            .collect();
        let fleet = Fleet::new(specs);
        let snap = fleet.snapshot();
        for (inst, &st) in snap.instances().iter().zip(&states) {
            inst.set_state(match st { 1 => InstanceState::Draining, 2 => InstanceState::Ejected, _ => InstanceState::Healthy });
        }
        let mut rng = RouteRng::seed_from_u64(seed);
        for kind in StrategyKind::all() {
            let s = StrategyConfig::new(kind).build().map_err(|e| TestCaseError::fail(e.to_string()))?;
            for i in 0..500 {
                let req = RouteRequest { key: if i % 7 == 0 { None } else { Some(key(i)) }, model: Some("m"), ..RouteRequest::keyed(None, None) };
                match s.select(&req, &snap, &mut rng) {
                    Ok(d) => {
                        let inst = &snap.instances()[d.index];
                        prop_assert!(inst.is_healthy() && inst.serves(Some("m")), "{} chose {}", kind.name(), inst.id());
                    }
                    Err(e) => {
                        // Some member serves "m" (every instance with no model list does): it is
                        // unavailable, not unknown.
                        let listed = snap.instances().iter().any(|i| i.serves(Some("m")));
                        let expected = if listed {
                            RouteError::ModelUnavailable("m".into())
                        } else {
                            RouteError::ModelNotServed("m".into())
                        };
                        prop_assert_eq!(e, expected);
                        prop_assert!(snap.eligible(Some("m")).next().is_none());
                    }
                }
            }
        }
    }
}

#[test]
fn no_healthy_instance_errors() {
    let fleet = Fleet::new(vec![spec(0)]);
    fleet.snapshot().instances()[0].set_state(InstanceState::Ejected);
    let mut rng = RouteRng::seed_from_u64(0);
    for kind in StrategyKind::all() {
        let s = StrategyConfig::new(kind)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let req = RouteRequest {
            key: Some(key(1)),
            model: None,
            ..RouteRequest::keyed(None, None)
        };
        assert_eq!(
            s.select(&req, &fleet.snapshot(), &mut rng),
            Err(RouteError::NoHealthyInstance)
        );
    }
}

#[test]
fn least_outstanding_ties_are_spread() {
    let snap = Fleet::new((0..8).map(spec).collect()).snapshot();
    let mut rng = RouteRng::seed_from_u64(3);
    let s = StrategyConfig::new(StrategyKind::named("least-outstanding").expect("registered"))
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let pa = prefix_aware(1, OverflowPolicy::NextInOrder, None);
    let mut counts = [0u32; 8];
    let mut no_key = [0u32; 8];
    for _ in 0..8_000 {
        let req = RouteRequest {
            key: None,
            model: None,
            ..RouteRequest::keyed(None, None)
        };
        counts[s
            .select(&req, &snap, &mut rng)
            .map(|d| d.index)
            .unwrap_or(0)] += 1;
        no_key[pa
            .select(&req, &snap, &mut rng)
            .map(|d| d.index)
            .unwrap_or(0)] += 1;
    }
    for c in counts.iter().chain(&no_key) {
        assert!(
            (700..1300).contains(c),
            "ties not spread: {counts:?} {no_key:?}"
        );
    }
}

#[test]
fn overflow_next_in_order_is_a_stable_second_home_and_all_busy_falls_back() {
    let snap = Fleet::new((0..6).map(spec).collect()).snapshot();
    let s = prefix_aware(2, OverflowPolicy::NextInOrder, None);
    let mut rng = RouteRng::seed_from_u64(4);
    let k = key(42);
    let order = s.rendezvous_order(k, &snap, None);
    let first = &snap.instances()[order[0]];
    first.acquire();
    first.acquire();
    for _ in 0..10 {
        let d = s.select(
            &RouteRequest {
                key: Some(k),
                model: None,
                ..RouteRequest::keyed(None, None)
            },
            &snap,
            &mut rng,
        );
        assert_eq!(
            d.map(|d| (d.index, d.reason)),
            Ok((
                order[1],
                Reason::Overflow {
                    from: first.id().clone()
                }
            ))
        );
    }
    for inst in snap.instances() {
        while inst.in_flight() < 2 {
            inst.acquire();
        }
    }
    snap.instances()[order[3]].acquire();
    let d = s.select(
        &RouteRequest {
            key: Some(k),
            model: None,
            ..RouteRequest::keyed(None, None)
        },
        &snap,
        &mut rng,
    );
    let d = d.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        d.reason,
        Reason::AllBusy {
            from: first.id().clone()
        }
    );
    assert_ne!(d.index, order[3], "all-busy goes to the least loaded");
}

#[test]
fn balance_factor_caps_load_below_the_threshold() {
    let snap = Fleet::new((0..4).map(spec).collect()).snapshot();
    let s = prefix_aware(100, OverflowPolicy::NextInOrder, Some(1.5));
    let mut rng = RouteRng::seed_from_u64(5);
    // One hot key, requests never finish: loads must stay within ceil(1.5 * (total + 1) / 4).
    for _ in 0..200 {
        let d = s
            .select(
                &RouteRequest {
                    key: Some(key(7)),
                    model: None,
                    ..RouteRequest::keyed(None, None)
                },
                &snap,
                &mut rng,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        snap.instances()[d.index].acquire();
    }
    let loads: Vec<u32> = snap.instances().iter().map(|i| i.in_flight()).collect();
    let max = loads.iter().copied().max().unwrap_or(0);
    assert!(max <= 76, "bounded loads violated: {loads:?}");
}

#[test]
fn weighted_rendezvous_follows_weights() {
    let specs: Vec<InstanceSpec> = (0..3)
        .map(|i| InstanceSpec {
            weight: if i == 0 { 2 } else { 1 },
            ..spec(i)
        })
        .collect();
    let snap = Fleet::new(specs).snapshot();
    let s = prefix_aware(1024, OverflowPolicy::NextInOrder, None);
    let mut counts = [0u32; 3];
    for i in 0..40_000 {
        counts[s.preferred(key(i), &snap, None).unwrap_or(0)] += 1;
    }
    // Expected shares 1/2, 1/4, 1/4.
    assert!((19_000..21_000).contains(&counts[0]), "{counts:?}");
}

#[test]
fn decisions_are_deterministic_given_the_seed() {
    let run = |seed: u64| -> Vec<usize> {
        let snap = Fleet::new((0..10).map(spec).collect()).snapshot();
        let mut rng = RouteRng::seed_from_u64(seed);
        let mut out = Vec::new();
        for kind in StrategyKind::all() {
            let s = StrategyConfig::new(kind)
                .build()
                .unwrap_or_else(|e| panic!("{e}"));
            for i in 0..300u64 {
                let k = if rng.gen_bool(0.2) {
                    None
                } else {
                    Some(key(i))
                };
                let d = s
                    .select(
                        &RouteRequest {
                            key: k,
                            model: None,
                            ..RouteRequest::keyed(None, None)
                        },
                        &snap,
                        &mut rng,
                    )
                    .map(|d| d.index)
                    .unwrap_or(usize::MAX);
                snap.instances()[d % 10].acquire();
                out.push(d);
            }
        }
        out
    };
    assert_eq!(run(9), run(9));
    assert_ne!(run(9), run(10));
}
