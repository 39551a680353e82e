//! The strategy trait and the configuration that builds each strategy.

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
    pub const ALL: [StrategyKind; 4] =
        [StrategyKind::Random, StrategyKind::RoundRobin, StrategyKind::LeastOutstanding, StrategyKind::PrefixAware];

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
        StrategyKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| ConfigError::UnknownName {
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
    /// Builds the strategy.
    pub fn build(&self) -> Result<Box<dyn Strategy>, ConfigError> {
        todo!("{self:?}")
    }
}
