//! The strategy contract, the registry of strategies and the configuration that builds one.
//!
//! A strategy sees a [`RouteRequest`] (key, block chain, length, model, the caller's clock) and
//! an immutable [`FleetSnapshot`], and returns a [`Decision`]. The caller does not act on the
//! decision itself: [`crate::dispatch`] counts the request in flight, tells the strategy it was
//! sent ([`Strategy::dispatched`]) and hands back a [`crate::Ticket`] on which the caller reports
//! what happened ([`Feedback`]). Membership changes are told with [`Strategy::membership`].
//! Stateless strategies implement only `name` and `select`.
//!
//! Adding a strategy is one file in `strategies/` with a `pub const ENTRY: StrategyEntry` and one
//! line in [`REGISTRY`]: every subcommand, the admin API and `--help` list strategies from it.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::strategies::{
    cache_aware, kv_aware, least_outstanding, prefix_aware, random, round_robin,
};
use crate::{
    ChainSpec, ConcurrencyThreshold, ConfigError, Decision, FleetSnapshot, Instance, InstanceId,
    KeyHash, RouteError,
};

/// The seeded RNG every strategy draws from (replayable runs).
pub type RouteRng = rand_pcg::Pcg64Mcg;

/// What a strategy sees of a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RouteRequest<'a> {
    /// Routing key, if the request has one.
    pub key: Option<KeyHash>,
    /// The block chain of its prompt (empty unless the strategy has a [`Strategy::chain_spec`]).
    pub chain: &'a [u64],
    /// Prompt length in the chain's units (characters, or bytes for the native API), as far as
    /// extraction read it.
    pub prompt_units: u32,
    /// Requested model or adapter: only instances serving it are eligible.
    pub model: Option<&'a str>,
    /// The caller's clock in seconds (monotonic; simulated time in the simulator).
    pub now: f64,
    /// Its token blocks and what the engines report holding, for a strategy that
    /// [`reads_tokens`](Strategy::reads_tokens) (`None`: not tokenized, or no reports).
    pub tokens: Option<crate::TokenRoute<'a>>,
    /// The client asked for its answer whole (OpenAI `stream` false or absent): the router
    /// will see no first token, only the whole answer after its decode, so a strategy that
    /// counts queued prefill must end the wait itself (`cache-aware` does at the first token
    /// it expected). `false` where the API does not say (the native API, other paths).
    pub whole_answer: bool,
}

impl<'a> RouteRequest<'a> {
    /// A request known only by its key (no chain), at time 0.
    pub fn keyed(key: Option<KeyHash>, model: Option<&'a str>) -> Self {
        Self {
            key,
            chain: &[],
            prompt_units: 0,
            model,
            now: 0.0,
            tokens: None,
            whole_answer: false,
        }
    }
}

/// What the engine said about a request's prompt (OpenAI `usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens`, when the engine reports it.
    pub cached_tokens: Option<u32>,
}

/// What happened to a dispatched request, reported on its ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feedback {
    /// The first token (or first response byte) came back.
    FirstToken,
    /// The answer completed; `usage` when the engine reported it.
    Finished { usage: Option<Usage> },
    /// The instance failed the request (error status, connect error, cut stream).
    Failed,
    /// The client went away, or the caller dropped the ticket without an outcome.
    Cancelled,
}

/// Words a strategy keeps on a ticket ([`Strategy::dispatched`]).
pub const NOTE_WORDS: usize = 4;
/// What a strategy keeps on a ticket: opaque to everyone else.
pub type Note = [u64; NOTE_WORDS];

/// What a strategy remembers about one dispatched request, handed back with each feedback.
#[derive(Debug, Clone, PartialEq)]
pub struct TicketInfo {
    /// The instance it went to.
    pub instance: InstanceId,
    /// That instance's id hash.
    pub instance_hash: u64,
    /// Prompt length in chain units.
    pub prompt_units: u32,
    /// Units the strategy expected the instance to have cached (0 for strategies that do not
    /// predict).
    pub predicted_cached_units: u32,
    /// Opaque words the strategy stored at dispatch ([`Strategy::dispatched`]).
    pub note: Note,
    /// When it was sent.
    pub sent_at: f64,
    /// When its first token came (set by the ticket before [`Feedback::FirstToken`] is told).
    pub first_token_at: Option<f64>,
    /// Whether `first_token_at` is a first token (a streamed answer), or only when a whole
    /// unstreamed answer arrived ([`Ticket::unstreamed`](crate::Ticket::unstreamed)): that
    /// time includes the decode, so it is no sample of the time to first token.
    pub streamed: bool,
    /// [`RouteRequest::whole_answer`] as dispatched: what the client asked for, where
    /// `streamed` is what came back.
    pub whole_answer: bool,
}

/// A change of membership or state, told to the strategy by whoever changed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipChange {
    /// Joined the fleet.
    Added,
    /// Healthy again after an ejection or drain.
    Healthy,
    /// Finishes what it has; gets nothing new.
    Draining,
    /// Failing health checks (it may come back with an empty cache).
    Ejected,
    /// Left the fleet.
    Removed,
}

/// Figures a strategy exports about its learned state (for `/metrics` and reports).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StrategyStats {
    /// Tracked blocks in the index.
    pub index_blocks: u64,
    /// The index's budget in blocks.
    pub index_budget_blocks: u64,
    /// Bytes the index holds (entries and table).
    pub index_bytes: u64,
    /// Sum of predicted cached tokens over requests whose engine reported usage.
    pub predicted_cached_tokens: u64,
    /// Sum of engine-reported cached tokens over the same requests.
    pub reported_cached_tokens: u64,
    /// Matched length of each decision, in blocks: counts per bucket `[0, 1, 2-3, 4-7, ...]`.
    pub match_blocks_histogram: Vec<u64>,
}

impl StrategyStats {
    /// Engine-reported over predicted cached tokens: near 1 the index agrees with the engines,
    /// far below 1 it predicts hits they do not have. `None` until something was predicted.
    pub fn prediction_ratio(&self) -> Option<f64> {
        (self.predicted_cached_tokens > 0)
            .then(|| self.reported_cached_tokens as f64 / self.predicted_cached_tokens as f64)
    }
}

/// A routing strategy: picks an eligible, healthy instance of a snapshot for a request.
pub trait Strategy: Send + Sync + std::fmt::Debug {
    /// Name as given in configuration (`random`, `prefix-aware`, ...).
    fn name(&self) -> &'static str;
    /// Chooses an instance. Never blocks; reads in-flight counts but does not change them, and
    /// changes no learned state (a decision may be thrown away).
    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        rng: &mut RouteRng,
    ) -> Result<Decision, RouteError>;
    /// How requests' block chains are cut, if the strategy reads them (extraction then reads
    /// past the key's prefix, up to the spec's bound).
    fn chain_spec(&self) -> Option<ChainSpec> {
        None
    }
    /// Whether [`Feedback::Finished`] should carry the engine's usage: a caller reads it out of
    /// the response only for a strategy that learns from it (the server scans the body for it).
    fn reads_usage(&self) -> bool {
        false
    }
    /// Whether it routes on the engines' own reports of what they hold: the caller then
    /// tokenizes requests as the engines do and passes [`RouteRequest::tokens`] where it can.
    fn reads_tokens(&self) -> bool {
        false
    }
    /// The request of `decision` was sent to `instance`: learn from it. Returns opaque words the
    /// ticket keeps and hands back with each feedback ([`TicketInfo::note`]).
    fn dispatched(&self, req: &RouteRequest<'_>, decision: &Decision, instance: &Instance) -> Note {
        let _ = (req, decision, instance);
        [0; NOTE_WORDS]
    }
    /// Something happened to a dispatched request. Called by the ticket: `FirstToken` at most
    /// once and before the one terminal event.
    fn feedback(&self, ticket: &TicketInfo, event: &Feedback, now: f64) {
        let _ = (ticket, event, now);
    }
    /// An instance joined, left or changed state.
    fn membership(&self, instance: &InstanceId, change: MembershipChange, now: f64) {
        let _ = (instance, change, now);
    }
    /// Figures about learned state, if the strategy has any.
    fn stats(&self) -> Option<StrategyStats> {
        None
    }
}

/// A strategy-specific parameter: its name, default and meaning (for `--help` and errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamSpec {
    /// Name as written in `--strategy-param NAME=VALUE` and the config file.
    pub name: &'static str,
    /// Default value, as text.
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
}

/// One registered strategy.
#[derive(Debug, Clone, Copy)]
pub struct StrategyEntry {
    /// Configuration name.
    pub name: &'static str,
    /// One line for `--help`.
    pub about: &'static str,
    /// Its own parameters (beyond the prefix-aware flags every config carries).
    pub params: &'static [ParamSpec],
    /// Builds it.
    pub build: fn(&StrategyConfig) -> Result<Arc<dyn Strategy>, ConfigError>,
}

/// Every strategy, in display order. One line per strategy.
pub const REGISTRY: &[StrategyEntry] = &[
    random::ENTRY,
    round_robin::ENTRY,
    least_outstanding::ENTRY,
    prefix_aware::ENTRY,
    cache_aware::ENTRY,
    kv_aware::ENTRY,
];

/// Which strategy: a handle on a [`REGISTRY`] entry.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StrategyKind(u8);

impl std::fmt::Debug for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StrategyKind({})", self.name())
    }
}

impl std::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl StrategyKind {
    /// Every kind, in registry order.
    pub fn all() -> impl Iterator<Item = StrategyKind> + Clone {
        (0..REGISTRY.len() as u8).map(StrategyKind)
    }
    /// The kind registered under `name`.
    pub fn named(name: &str) -> Option<StrategyKind> {
        REGISTRY
            .iter()
            .position(|e| e.name == name)
            .map(|i| StrategyKind(i as u8))
    }
    /// Its registry entry.
    pub fn entry(self) -> &'static StrategyEntry {
        &REGISTRY[self.0 as usize]
    }
    /// Configuration name.
    pub fn name(self) -> &'static str {
        self.entry().name
    }
    /// Every name, comma-separated (for help and errors).
    pub fn names() -> String {
        REGISTRY
            .iter()
            .map(|e| e.name)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::str::FromStr for StrategyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StrategyKind::named(s).ok_or_else(|| ConfigError::UnknownStrategy {
            value: s.to_string(),
            expected: StrategyKind::names(),
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
    /// The strategy's own parameters ([`StrategyEntry::params`]), as text; checked by `build`.
    pub params: BTreeMap<String, String>,
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
    /// balance factor, no parameters.
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
            params: BTreeMap::new(),
        }
    }

    /// Builds the strategy; fails on a bad balance factor or a parameter the strategy does not
    /// know or cannot parse.
    pub fn build(&self) -> Result<Arc<dyn Strategy>, ConfigError> {
        let entry = self.kind.entry();
        if let Some(unknown) = self
            .params
            .keys()
            .find(|k| !entry.params.iter().any(|p| p.name == k.as_str()))
        {
            let known: Vec<&str> = entry.params.iter().map(|p| p.name).collect();
            return Err(ConfigError::Param {
                strategy: entry.name,
                param: unknown.clone(),
                why: if known.is_empty() {
                    "this strategy has no parameters".into()
                } else {
                    format!("unknown (expected one of: {})", known.join(", "))
                },
            });
        }
        (entry.build)(self)
    }

    /// Parameter `name` parsed as `T`, or its registered default.
    pub fn param<T: std::str::FromStr>(&self, name: &'static str) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        let entry = self.kind.entry();
        let text = match self.params.get(name) {
            Some(v) => v.as_str(),
            None => entry
                .params
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.default)
                .unwrap_or(""),
        };
        text.trim().parse::<T>().map_err(|e| ConfigError::Param {
            strategy: entry.name,
            param: name.to_string(),
            why: format!("'{text}': {e}"),
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

    fn kind(name: &str) -> StrategyKind {
        StrategyKind::named(name).unwrap_or_else(|| panic!("{name} registered"))
    }

    #[test]
    fn names_round_trip() {
        for k in StrategyKind::all() {
            assert_eq!(k.name().parse::<StrategyKind>(), Ok(k));
            assert_eq!(
                StrategyConfig::new(k).build().map(|s| s.name()),
                Ok(k.name())
            );
        }
        assert_eq!(StrategyKind::all().count(), REGISTRY.len());
        match "fastest".parse::<StrategyKind>() {
            Err(ConfigError::UnknownStrategy { expected, .. }) => {
                assert!(expected.contains("cache-aware") && expected.contains("random"))
            }
            other => panic!("{other:?}"),
        }
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
        let c = StrategyConfig::new(kind("prefix-aware"));
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

    #[test]
    fn parameters_are_checked_by_name_and_value() {
        let mut c = StrategyConfig::new(kind("random"));
        c.params.insert("x".into(), "1".into());
        let e = c.build().map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("'x'") && e.contains("no parameters"), "{e}");
        let mut c = StrategyConfig::new(kind("cache-aware"));
        c.params.insert("index-blocks".into(), "lots".into());
        let e = c.build().map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("index-blocks") && e.contains("lots"), "{e}");
        c.params.insert("index-blocks".into(), "1000".into());
        assert!(c.build().is_ok());
        c.params.insert("nope".into(), "1".into());
        let e = c.build().map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("expected one of") && e.contains("index-blocks"),
            "{e}"
        );
    }
}
