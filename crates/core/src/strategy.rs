//! The strategy trait and the configuration that builds each strategy.

use crate::strategies::{LeastOutstanding, PrefixAware, Random, RoundRobin};
use crate::{ConcurrencyThreshold, ConfigError, Decision, FleetSnapshot, KeyHash, RouteError};

/// The seeded RNG every strategy draws from (replayable runs).
pub type RouteRng = rand_pcg::Pcg64Mcg;

/// What a strategy sees of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRequest<'a> {
    /// Routing key, if the request has one.
    pub key: Option<KeyHash>,
    /// Requested model or adapter: only instances serving it are eligible.
    pub model: Option<&'a str>,
}

/// A routing strategy: picks an eligible, healthy instance of a snapshot for a request.
pub trait Strategy: Send + Sync + std::fmt::Debug {
    /// Name as given in configuration (`random`, `prefix-aware`, ...).
    fn name(&self) -> &'static str;
    /// Chooses an instance. Never blocks; reads in-flight counts but does not change them.
    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        rng: &mut RouteRng,
    ) -> Result<Decision, RouteError>;
}

/// Which strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrategyKind {
    /// Uniform among eligible healthy instances.
    Random,
    /// Rotation.
    RoundRobin,
    /// Fewest in flight, ties at random.
    LeastOutstanding,
    /// Rendezvous hashing with overflow.
    PrefixAware,
}

impl StrategyKind {
    /// Every kind, in display order.
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::Random,
        StrategyKind::RoundRobin,
        StrategyKind::LeastOutstanding,
        StrategyKind::PrefixAware,
    ];

    /// Configuration name.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Random => "random",
            StrategyKind::RoundRobin => "round-robin",
            StrategyKind::LeastOutstanding => "least-outstanding",
            StrategyKind::PrefixAware => "prefix-aware",
        }
    }
}

impl std::str::FromStr for StrategyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategyKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| ConfigError::UnknownName {
                field: "strategy",
                value: s.to_string(),
                expected: "random, round-robin, least-outstanding, prefix-aware",
            })
    }
}

/// Where prefix-aware routing sends a request whose preferred instance is at its threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverflowPolicy {
    /// The next instance in the key's rendezvous order below the threshold (a stable second home).
    #[default]
    NextInOrder,
    /// The instance with the fewest in flight.
    LeastOutstanding,
}

/// Everything needed to build any strategy.
#[derive(Debug, Clone, PartialEq)]
pub struct StrategyConfig {
    /// Which strategy.
    pub kind: StrategyKind,
    /// Prefix-aware: in-flight count at which the preferred instance overflows.
    pub concurrency_threshold: ConcurrencyThreshold,
    /// Prefix-aware: where overflow goes.
    pub overflow: OverflowPolicy,
    /// Prefix-aware: optional bounded-load factor c > 1.
    pub balance_factor: Option<f64>,
}

impl StrategyConfig {
    /// Default in-flight threshold of prefix-aware routing: 32 requests per instance. An engine
    /// batches tens of sequences per step with little extra latency (vLLM's `max_num_seqs`
    /// defaults to 256, but time per decode step grows with the batch), so 32 keeps a hot prefix
    /// on its home instance through ordinary bursts and overflows before a deep queue forms.
    /// Tune it per deployment (`prefix-router analyze` and the simulator help).
    pub const DEFAULT_CONCURRENCY_THRESHOLD: u32 = 32;

    /// A configuration for `kind` with the defaults: threshold
    /// [`Self::DEFAULT_CONCURRENCY_THRESHOLD`], overflow [`OverflowPolicy::NextInOrder`], no
    /// balance factor.
    pub fn new(kind: StrategyKind) -> Self {
        // Compile-time constant within 1..=1024: the fallback is unreachable but avoids a panic path.
        let concurrency_threshold =
            ConcurrencyThreshold::new(u64::from(Self::DEFAULT_CONCURRENCY_THRESHOLD))
                .unwrap_or(ConcurrencyThreshold::MIN);
        Self {
            kind,
            concurrency_threshold,
            overflow: OverflowPolicy::default(),
            balance_factor: None,
        }
    }

    /// Builds the strategy; fails when `balance_factor` is set but not a finite number above 1.
    pub fn build(&self) -> Result<Box<dyn Strategy>, ConfigError> {
        Ok(match self.kind {
            StrategyKind::Random => Box::new(Random),
            StrategyKind::RoundRobin => Box::new(RoundRobin::default()),
            StrategyKind::LeastOutstanding => Box::new(LeastOutstanding),
            StrategyKind::PrefixAware => Box::new(PrefixAware::new(
                self.concurrency_threshold,
                self.overflow,
                self.balance_factor,
            )?),
        })
    }
}

impl std::str::FromStr for OverflowPolicy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "next-in-order" => Ok(OverflowPolicy::NextInOrder),
            "least-outstanding" => Ok(OverflowPolicy::LeastOutstanding),
            _ => Err(ConfigError::UnknownName {
                field: "overflow",
                value: s.to_string(),
                expected: "next-in-order, least-outstanding",
            }),
        }
    }
}

impl OverflowPolicy {
    /// Configuration name (`next-in-order`, `least-outstanding`).
    pub fn name(self) -> &'static str {
        match self {
            OverflowPolicy::NextInOrder => "next-in-order",
            OverflowPolicy::LeastOutstanding => "least-outstanding",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for k in StrategyKind::ALL {
            assert_eq!(k.name().parse::<StrategyKind>(), Ok(k));
            assert_eq!(
                StrategyConfig::new(k).build().map(|s| s.name()),
                Ok(k.name())
            );
        }
        assert!("fastest".parse::<StrategyKind>().is_err());
        for p in [
            OverflowPolicy::NextInOrder,
            OverflowPolicy::LeastOutstanding,
        ] {
            assert_eq!(p.name().parse::<OverflowPolicy>(), Ok(p));
        }
        assert!("spill".parse::<OverflowPolicy>().is_err());
    }

    #[test]
    fn defaults_and_balance_factor_validation() {
        let c = StrategyConfig::new(StrategyKind::PrefixAware);
        assert_eq!(c.concurrency_threshold.get(), 32);
        assert_eq!(c.overflow, OverflowPolicy::NextInOrder);
        assert_eq!(c.balance_factor, None);
        for bad in [1.0, 0.5, f64::NAN, f64::INFINITY] {
            let c = StrategyConfig {
                balance_factor: Some(bad),
                ..c.clone()
            };
            assert!(matches!(c.build(), Err(ConfigError::BalanceFactor(_))));
        }
        assert!(StrategyConfig {
            balance_factor: Some(1.25),
            ..c
        }
        .build()
        .is_ok());
    }
}
