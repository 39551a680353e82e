//! `least-outstanding`: fewest in-flight requests, ties broken uniformly at random.

use super::common::{least_outstanding, no_instance};
use crate::{Decision, FleetSnapshot, Reason, RouteError, RouteRequest, RouteRng, Strategy};

/// Fewest in flight among eligible healthy instances; ties at random, never "the first one".
#[derive(Debug, Default, Clone, Copy)]
pub struct LeastOutstanding;

/// Registry entry.
pub const ENTRY: crate::strategy::StrategyEntry = crate::strategy::StrategyEntry {
    name: "least-outstanding",
    about: "fewest in-flight requests, ties at random",
    params: &[],
    build: |_| Ok(std::sync::Arc::new(LeastOutstanding)),
};

impl Strategy for LeastOutstanding {
    fn name(&self) -> &'static str {
        "least-outstanding"
    }

    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        least_outstanding(fleet, req.model, rng, |_| true)
            .map(|index| Decision::new(index, Reason::LeastOutstanding))
            .ok_or_else(|| no_instance(fleet, req.model))
    }
}
