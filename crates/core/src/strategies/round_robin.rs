//! `round-robin`: classic rotation over the eligible healthy instances.

use super::common::{count_eligible, no_instance, nth_eligible};
use crate::{Decision, FleetSnapshot, Reason, RouteError, RouteRequest, RouteRng, Strategy};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Rotation: the n-th request goes to eligible instance `n mod count`. The counter is shared by
/// all models, so per-model rotation is only approximately even when models differ.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

/// Registry entry.
pub const ENTRY: crate::strategy::StrategyEntry = crate::strategy::StrategyEntry {
    name: "round-robin",
    about: "classic rotation over eligible healthy instances",
    params: &[],
    build: |_| Ok(std::sync::Arc::new(RoundRobin::default())),
};

impl Strategy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        _rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        let n = count_eligible(fleet, req.model);
        if n == 0 {
            return Err(no_instance(fleet, req.model));
        }
        // The rotation moves on when a request is sent (`dispatched`), not here: `select` is
        // also asked where a request would go next (the endpoint picker's fallbacks), which
        // must not move it. Two requests selected at the very same moment may share a turn.
        let k = self.next.load(Ordering::Relaxed) % n;
        nth_eligible(fleet, req.model, k)
            .map(|index| Decision::new(index, Reason::RoundRobin))
            .ok_or_else(|| no_instance(fleet, req.model))
    }

    fn dispatched(
        &self,
        _req: &RouteRequest<'_>,
        _decision: &Decision,
        _instance: &crate::Instance,
    ) -> crate::strategy::Note {
        self.next.fetch_add(1, Ordering::Relaxed);
        [0; crate::strategy::NOTE_WORDS]
    }
}
