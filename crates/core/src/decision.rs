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
    /// Cache-aware: the instance with the longest known match starts it soonest.
    CacheHit,
    /// Cache-aware: no instance is known to hold any of it; placed where it starts soonest.
    Cold,
    /// Cache-aware: the longest match (on `from`) was busy; this instance, which also holds part
    /// of the prefix, starts it sooner (a hot prefix gaining a home).
    HotReplica { from: InstanceId },
    /// Cache-aware: the longest match (on `from`) was busy; recomputing here starts sooner.
    Load { from: InstanceId },
    /// Not routed: a hot prefix replayed to a joining instance before it takes its share
    /// ([`crate::prewarm`]).
    Prewarm,
    /// Not routed: the proxy could not reach the instance chosen (`from`) and this one, next in
    /// the order the router gave it, answered.
    Fallback { from: InstanceId },
    /// Not routed: the request continues a response this instance gave and stores (the
    /// Responses API's `previous_response_id`, or a request for that response), which no other
    /// instance holds.
    StoredResponse,
}

impl Reason {
    /// Short label for metrics (`preferred`, `overflow`, `all_busy`, `no_key`, ...).
    pub fn label(&self) -> &'static str {
        Self::LABELS[self.index()]
    }
    /// Every label, in the order of [`Reason::index`] (per-instance counters keep one slot per
    /// reason, without a lock or a string key).
    pub const LABELS: [&'static str; 14] = [
        "preferred",
        "overflow",
        "all_busy",
        "no_key",
        "random",
        "round_robin",
        "least_outstanding",
        "cache_hit",
        "cold",
        "hot_replica",
        "load",
        "prewarm",
        "fallback",
        "stored_response",
    ];

    /// This reason's position in [`Reason::LABELS`].
    pub fn index(&self) -> usize {
        match self {
            Reason::Preferred => 0,
            Reason::Overflow { .. } => 1,
            Reason::AllBusy { .. } => 2,
            Reason::NoKey => 3,
            Reason::Random => 4,
            Reason::RoundRobin => 5,
            Reason::LeastOutstanding => 6,
            Reason::CacheHit => 7,
            Reason::Cold => 8,
            Reason::HotReplica { .. } => 9,
            Reason::Load { .. } => 10,
            Reason::Prewarm => 11,
            Reason::Fallback { .. } => 12,
            Reason::StoredResponse => 13,
        }
    }

    /// The labels of the reasons [`Reason::is_overflow`] counts: for whoever reads decisions
    /// back by label (`bench`, from the decision header), so that its overflow share counts
    /// what the server's and the simulator's do.
    pub const OVERFLOW_LABELS: [&'static str; 4] = ["overflow", "all_busy", "hot_replica", "load"];

    /// Whether the key's preferred instance was skipped because of load.
    pub fn is_overflow(&self) -> bool {
        matches!(
            self,
            Reason::Overflow { .. }
                | Reason::AllBusy { .. }
                | Reason::HotReplica { .. }
                | Reason::Load { .. }
        )
    }
}

/// A routing decision: an index into the snapshot the strategy was given, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Index into [`crate::FleetSnapshot::instances`].
    pub index: usize,
    /// Why.
    pub reason: Reason,
    /// Prompt units the strategy expects the chosen instance to have cached (0 if it does not
    /// predict).
    pub predicted_cached_units: u32,
}

impl Decision {
    /// A decision without a cache prediction.
    pub fn new(index: usize, reason: Reason) -> Self {
        Self {
            index,
            reason,
            predicted_cached_units: 0,
        }
    }
}

/// No instance can take the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No instance of the fleet serves the requested model, in any state: a client error.
    #[error("no instance serves model '{0}'")]
    ModelNotServed(String),
    /// Instances serve the requested model, but none of them takes requests right now
    /// (ejected, draining, or not yet checked): an outage, worth retrying later.
    #[error("no healthy instance serves model '{0}' right now")]
    ModelUnavailable(String),
    /// No healthy instance at all (or an empty fleet).
    #[error("no healthy instance available")]
    NoHealthyInstance,
    /// The strategy named a position outside the snapshot (a bug of the strategy).
    #[error("strategy '{0}' chose an instance outside the fleet")]
    OutOfRange(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_own_label_and_overflow_labels_name_the_overflows() {
        let id = InstanceId(std::sync::Arc::from("x"));
        let mut seen = [false; Reason::LABELS.len()];
        for r in [
            Reason::Preferred,
            Reason::Overflow { from: id.clone() },
            Reason::AllBusy { from: id.clone() },
            Reason::NoKey,
            Reason::Random,
            Reason::RoundRobin,
            Reason::LeastOutstanding,
            Reason::CacheHit,
            Reason::Cold,
            Reason::HotReplica { from: id.clone() },
            Reason::Load { from: id.clone() },
            Reason::Prewarm,
            Reason::Fallback { from: id },
            Reason::StoredResponse,
        ] {
            assert!(!std::mem::replace(&mut seen[r.index()], true), "{r:?}");
            assert_eq!(
                r.is_overflow(),
                Reason::OVERFLOW_LABELS.contains(&r.label()),
                "{r:?}"
            );
        }
        assert!(seen.iter().all(|&s| s), "a label no reason has");
    }
}
