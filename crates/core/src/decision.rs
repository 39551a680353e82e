//! What a strategy decided and why.

use crate::InstanceId;

/// Why an instance was chosen; the server and the simulator count these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The key's first rendezvous choice.
    Preferred,
    /// The preferred instance was at its threshold (or load bound); this is the overflow target.
    Overflow { from: InstanceId },
    /// Every eligible instance was at its threshold: least-outstanding overall.
    AllBusy { from: InstanceId },
    /// The request had no key: fell back to least-outstanding.
    NoKey,
    /// Chosen at random.
    Random,
    /// Next in rotation.
    RoundRobin,
    /// Fewest in flight.
    LeastOutstanding,
}

impl Reason {
    /// Short label for metrics (`preferred`, `overflow`, `all_busy`, `no_key`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Preferred => "preferred",
            Reason::Overflow { .. } => "overflow",
            Reason::AllBusy { .. } => "all_busy",
            Reason::NoKey => "no_key",
            Reason::Random => "random",
            Reason::RoundRobin => "round_robin",
            Reason::LeastOutstanding => "least_outstanding",
        }
    }
    /// Whether the key's preferred instance was skipped because of load.
    pub fn is_overflow(&self) -> bool {
        matches!(self, Reason::Overflow { .. } | Reason::AllBusy { .. })
    }
}

/// A routing decision: an index into the snapshot the strategy was given, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Index into [`crate::FleetSnapshot::instances`].
    pub index: usize,
    /// Why.
    pub reason: Reason,
}

/// No instance can take the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No healthy instance serves the requested model.
    #[error("no healthy instance serves model '{0}'")]
    ModelNotServed(String),
    /// No healthy instance at all.
    #[error("no healthy instance available")]
    NoHealthyInstance,
}
