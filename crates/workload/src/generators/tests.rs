use super::*;
use crate::request::Role;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

fn spec(kind: WorkloadKind, seed: u64, requests: u64) -> WorkloadSpec {
    WorkloadSpec {
        seed,
        requests,
        ..WorkloadSpec::default_for(kind)
    }
}

fn all(spec: &WorkloadSpec) -> Vec<Request> {
    generate(spec).collect()
}

#[test]
fn names_round_trip() {
    for k in WorkloadKind::ALL {
        assert_eq!(k.name().parse::<WorkloadKind>().unwrap(), k);
        assert_eq!(serde_json::to_value(k).unwrap(), k.name());
        assert!(!k.description().is_empty());
        assert_eq!(WorkloadSpec::default_for(k).validate(), Ok(()));
    }
    let err = "chat".parse::<WorkloadKind>().unwrap_err();
    assert!(err.to_string().contains("long-context"));
}

#[test]
fn deterministic_per_seed_and_seed_matters() {
    for k in WorkloadKind::ALL {
        let a = all(&spec(k, 7, 300));
        assert_eq!(a, all(&spec(k, 7, 300)), "{k}");
        assert_ne!(a, all(&spec(k, 8, 300)), "{k}");
    }
}

#[test]
fn counts_ids_and_sorted_arrivals() {
    for k in WorkloadKind::ALL {
        let r = all(&spec(k, 1, 500));
        assert_eq!(r.len(), 500, "{k}");
        for (i, q) in r.iter().enumerate() {
            assert_eq!(q.id, i as u64);
            assert!(q.output_tokens >= 1);
            assert!(q.prompt_tokens() >= 1);
        }
        assert!(
            r.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s),
            "{k}"
        );
    }
}

#[test]
fn request_rate_is_close_to_the_spec() {
    for k in WorkloadKind::ALL {
        let mut s = spec(k, 3, 3000);
        s.arrival = Arrival::Poisson { rate: 10.0 };
        let r = all(&s);
        let span = r.last().unwrap().arrival_s;
        let rate = r.len() as f64 / span;
        // Multi-turn kinds cut sessions at the end, so allow a generous band.
        assert!((7.0..13.0).contains(&rate), "{k}: {rate}");
    }
}

#[test]
fn long_context_shape() {
    let s = spec(WorkloadKind::LongContext, 5, 2000);
    let docs: HashSet<u64> = all(&s)
        .iter()
        .map(|r| {
            assert_eq!(r.messages.len(), 1);
            let m = &r.messages[0];
            assert_eq!(m.role, Role::User);
            assert_eq!(m.segments[0].tokens, DEFAULT_DOC_TOKENS);
            assert!((20..=60).contains(&m.segments[1].tokens));
            assert!((100..=300).contains(&r.output_tokens));
            m.segments[0].id
        })
        .collect();
    assert!(docs.len() <= DEFAULT_LONG_CONTEXT_DOCUMENTS as usize);
    assert!(docs.len() > DEFAULT_LONG_CONTEXT_DOCUMENTS as usize * 9 / 10);
}

#[test]
fn multi_turn_requests_resend_their_history() {
    for k in [WorkloadKind::Sharegpt, WorkloadKind::Agent] {
        let r = all(&spec(k, 11, 1500));
        // The first user message's id is unique per session.
        let mut last: HashMap<u64, &Request> = HashMap::new();
        let mut follow_ups = 0;
        for q in &r {
            let first_user = q.messages.iter().find(|m| m.role == Role::User).unwrap();
            let key = first_user.segments[0].id;
            if let Some(prev) = last.get(&key) {
                follow_ups += 1;
                assert!(q.messages.len() > prev.messages.len());
                assert_eq!(&q.messages[..prev.messages.len()], &prev.messages[..]);
                // The previous answer is resent with the length that was generated.
                assert_eq!(q.messages[prev.messages.len()].role, Role::Assistant);
                assert_eq!(q.messages[prev.messages.len()].tokens(), prev.output_tokens);
                assert!(q.arrival_s >= prev.arrival_s);
                let (a, b) = (prev.block_hashes(16), q.block_hashes(16));
                assert_eq!(&b[..a.len()], &a[..]);
            }
            last.insert(key, q);
        }
        assert!(follow_ups > r.len() / 3, "{k}: {follow_ups}");
    }
}

#[test]
fn hot_prefix_share() {
    let r = all(&spec(WorkloadKind::HotPrefix, 2, 4000));
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for q in &r {
        *counts.entry(q.messages[0].segments[0].id).or_default() += 1;
    }
    let top = counts.values().max().copied().unwrap_or(0) as f64 / r.len() as f64;
    assert!((0.46..0.54).contains(&top), "{top}");
}

#[test]
fn rag_shares_system_prompt_and_popular_chunks() {
    let r = all(&spec(WorkloadKind::Rag, 4, 2000));
    let system: HashSet<u64> = r.iter().map(|q| q.messages[0].segments[0].id).collect();
    assert_eq!(system.len(), 1);
    let first_chunk: HashSet<u64> = r.iter().map(|q| q.messages[1].segments[0].id).collect();
    // Zipf popularity: far fewer distinct first chunks than requests.
    assert!(first_chunk.len() < r.len() / 2, "{}", first_chunk.len());
    assert!(r.iter().all(|q| q.messages[1].segments.len() == 5));
}

#[test]
fn groups_are_stable_per_entity() {
    let mut s = spec(WorkloadKind::LongContext, 9, 1000);
    s.groups = Some(4);
    let mut of_doc: HashMap<u64, String> = HashMap::new();
    for q in all(&s) {
        let g = q.group.clone().unwrap();
        assert!(["tenant-0", "tenant-1", "tenant-2", "tenant-3"].contains(&g.as_str()));
        let doc = q.messages[0].segments[0].id;
        assert_eq!(of_doc.entry(doc).or_insert_with(|| g.clone()), &g);
    }
    assert_eq!(of_doc.values().collect::<HashSet<_>>().len(), 4);
}

#[test]
fn validate_names_the_field_and_generate_survives_bad_values() {
    let mut s = WorkloadSpec::default_for(WorkloadKind::Sharegpt);
    s.arrival = Arrival::Poisson { rate: -1.0 };
    assert_eq!(s.validate().unwrap_err().field, "arrival.rate");
    s.arrival = Arrival::Closed { clients: 4 };
    s.params = WorkloadParams::Sharegpt(SharegptParams {
        user_tokens: TokenDist {
            median: f64::NAN,
            sigma: -2.0,
            min: 9,
            max: 3,
        },
        mean_turns: f64::INFINITY,
        think_time_s: -3.0,
        system_prompt_share: 7.0,
        ..Default::default()
    });
    let err = s.validate().unwrap_err();
    assert_eq!(err.field, "params.mean_turns");
    assert!(err.to_string().contains("sharegpt"));
    s.requests = 200;
    assert_eq!(all(&s).len(), 200);
    s.params = WorkloadParams::default_for(WorkloadKind::Rag);
    assert_eq!(s.validate().unwrap_err().field, "params");
}

#[test]
fn spec_serializes_for_reports() {
    let v = serde_json::to_value(WorkloadSpec::default_for(WorkloadKind::LongContext)).unwrap();
    assert_eq!(v["kind"], "long-context");
    assert_eq!(v["arrival"]["type"], "closed");
    assert_eq!(v["arrival"]["clients"], DEFAULT_LONG_CONTEXT_CLIENTS);
    assert_eq!(v["params"]["documents"], DEFAULT_LONG_CONTEXT_DOCUMENTS);
    let v = serde_json::to_value(WorkloadSpec::default_for(WorkloadKind::Sharegpt)).unwrap();
    assert_eq!(v["arrival"]["type"], "poisson");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_seed_gives_sorted_dense_ids(seed in any::<u64>(), kind in 0usize..5, n in 0u64..120) {
        let r = all(&spec(WorkloadKind::ALL[kind], seed, n));
        prop_assert_eq!(r.len() as u64, n);
        for (i, q) in r.iter().enumerate() {
            prop_assert_eq!(q.id, i as u64);
        }
        prop_assert!(r.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s));
    }
}
