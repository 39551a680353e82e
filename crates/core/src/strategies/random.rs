//! `random`: uniform among eligible healthy instances (the reference service's default).

use super::common::{count_eligible, no_instance, nth_eligible};
use crate::{Decision, FleetSnapshot, Reason, RouteError, RouteRequest, RouteRng, Strategy};
use rand::Rng;

/// Uniform choice among instances that are healthy and serve the requested model.
#[derive(Debug, Default, Clone, Copy)]
pub struct Random;

/// Registry entry.
pub const ENTRY: crate::strategy::StrategyEntry = crate::strategy::StrategyEntry {
    name: "random",
    about: "uniform among eligible healthy instances (the reference service's default)",
    params: &[],
    build: |_| Ok(std::sync::Arc::new(Random)),
};

impl Strategy for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        let n = count_eligible(fleet, req.model);
        if n == 0 {
            return Err(no_instance(fleet, req.model));
        }
        let k = rng.gen_range(0..n);
        nth_eligible(fleet, req.model, k)
            .map(|index| Decision::new(index, Reason::Random))
            .ok_or_else(|| no_instance(fleet, req.model))
    }
}
