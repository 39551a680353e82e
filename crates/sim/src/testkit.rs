//! Small hand-built workloads and configurations for the unit tests.

use prefix_router_core::{PrefixLength, StrategyConfig, StrategyKind};
use prefix_router_workload::{Message, Request, Role, Segment};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

use crate::{Driver, SimConfig, SimWorkload, WorkloadSource};

/// Engine preset used by the tests.
pub const PRESET: &str = "small";

/// `n` requests over `docs` shared 400-token documents, each followed by a unique 24-token
/// question, Poisson arrivals at `rate` per second; all choices from `seed`.
pub fn shared_docs(n: usize, docs: u64, rate: f64, seed: u64) -> SimWorkload {
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut t = 0.0;
    let requests = (0..n)
        .map(|i| {
            t += -(1.0 - rng.gen::<f64>()).ln() / rate;
            let doc = 1 + rng.gen_range(0..docs);
            Request {
                id: i as u64,
                arrival_s: t,
                group: None,
                model: None,
                messages: vec![Message {
                    role: Role::User,
                    segments: vec![
                        Segment {
                            id: doc,
                            tokens: 400,
                        },
                        Segment {
                            id: 1_000_000 + i as u64,
                            tokens: 24,
                        },
                    ],
                }],
                output_tokens: rng.gen_range(4..32),
            }
        })
        .collect();
    SimWorkload {
        name: "test-docs".into(),
        source: WorkloadSource::Trace {
            path: "memory".into(),
            format: "test".into(),
        },
        requests,
    }
}

/// A configuration for `strategies` on `instances` instances of the small preset.
pub fn config(instances: u32, strategies: &[StrategyKind]) -> SimConfig {
    SimConfig {
        preset: PRESET.into(),
        instances,
        strategies: strategies.iter().map(|&k| StrategyConfig::new(k)).collect(),
        prefix_length: PrefixLength::new(1024).expect("1024 is a valid prefix length"),
        seed: 7,
        driver: Driver::OpenLoop,
        scale: Vec::new(),
        hit_rate_buckets: 10,
        kv_events: Default::default(),
        routers: Default::default(),
        prewarm: None,
        clairvoyant: false,
    }
}
