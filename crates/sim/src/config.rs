//! What a simulation runs: the fleet, the strategies and how clients send requests.

use prefix_router_core::{PrefixLength, StrategyConfig};
use prefix_router_workload::ScaleEvent;

use crate::SimError;

/// How the simulated clients send the workload's requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum Driver {
    /// Open loop: each request arrives at its `arrival_s`, whatever the fleet's state.
    OpenLoop,
    /// Closed loop: `clients` clients each send their next request (the workload's next unsent
    /// one) the moment their previous request finishes; `arrival_s` is ignored.
    ClosedLoop {
        /// Concurrent clients (≥ 1).
        clients: u32,
    },
}

/// Everything about a simulation except the workload.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Engine preset name (see `prefix_router_engine_model::PRESETS`); every instance uses it.
    pub preset: String,
    /// Instances at the start.
    pub instances: u32,
    /// Strategies to compare, run one after another on the same requests.
    pub strategies: Vec<StrategyConfig>,
    /// Characters of the chat text that form the routing key (as the server uses it).
    pub prefix_length: PrefixLength,
    /// Seed of the router's RNG (each strategy's run starts from it).
    pub seed: u64,
    /// Open or closed loop.
    pub driver: Driver,
    /// Instances added or removed during the run.
    pub scale: Vec<ScaleEvent>,
    /// Buckets of the hit-rate-over-time series (≥ 1).
    pub hit_rate_buckets: usize,
    /// How the engines' KV events reach strategies that read them (`kv-aware`).
    pub kv_events: crate::KvEventModel,
    /// The router replicas in front of the fleet, and whether they scrape the engines' queues.
    pub routers: crate::RouterModel,
    /// Prewarm instances that join (scale events) with the hottest prefixes that will move to
    /// them; `None`: they take their share at once.
    pub prewarm: Option<prefix_router_core::prewarm::PrewarmConfig>,
    /// Also run the clairvoyant reference after the strategies (a row named `clairvoyant`):
    /// each request sent where its first token would come soonest, read from the engines
    /// themselves ([`crate::run::run_clairvoyant`]).
    pub clairvoyant: bool,
}

impl SimConfig {
    /// Checks every setting that does not need the workload; errors name the setting.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.instances == 0 {
            return Err(SimError::ZeroInstances);
        }
        if self.strategies.is_empty() {
            return Err(SimError::InvalidConfig {
                field: "strategies",
                why: "at least one strategy is needed".into(),
            });
        }
        if let Driver::ClosedLoop { clients: 0 } = self.driver {
            return Err(SimError::InvalidConfig {
                field: "concurrency",
                why: "must be at least 1, got 0".into(),
            });
        }
        if self.hit_rate_buckets == 0 {
            return Err(SimError::InvalidConfig {
                field: "hit_rate_buckets",
                why: "must be at least 1".into(),
            });
        }
        let k = self.kv_events;
        if !(k.delay_s.is_finite() && k.delay_s >= 0.0) {
            return Err(SimError::InvalidConfig {
                field: "kv_event_delay",
                why: format!("must be a finite number of seconds ≥ 0, got {}", k.delay_s),
            });
        }
        if !(0.0..1.0).contains(&k.loss) {
            return Err(SimError::InvalidConfig {
                field: "kv_event_loss",
                why: format!("must be a share within [0, 1), got {}", k.loss),
            });
        }
        self.routers.validate()?;
        let mut healthy = i64::from(self.instances);
        for (at, delta) in self
            .scale_order()
            .map(|i| (self.scale[i].at_s, self.scale[i].delta))
        {
            if !at.is_finite() || at < 0.0 {
                return Err(SimError::InvalidConfig {
                    field: "scale",
                    why: format!("event time must be a finite number of seconds ≥ 0, got {at}"),
                });
            }
            if delta == 0 {
                return Err(SimError::InvalidConfig {
                    field: "scale",
                    why: format!("event at {at}s changes nothing (0)"),
                });
            }
            healthy += i64::from(delta);
            if healthy < 1 {
                return Err(SimError::InvalidConfig {
                    field: "scale",
                    why: format!(
                        "removing {} instances at {at}s would leave none to route to",
                        -delta
                    ),
                });
            }
        }
        Ok(())
    }

    /// Indices of the scale events in firing order (time, then position in the list).
    pub fn scale_order(&self) -> impl Iterator<Item = usize> {
        let mut order: Vec<usize> = (0..self.scale.len()).collect();
        order.sort_by(|&a, &b| {
            self.scale[a]
                .at_s
                .total_cmp(&self.scale[b].at_s)
                .then(a.cmp(&b))
        });
        order.into_iter()
    }
}
