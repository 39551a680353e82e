//! `least-outstanding`: fewest in-flight requests, ties broken uniformly at random. In flight
//! counts this router's own and, where the engines' queues are scraped, everyone else's.

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
        least_outstanding(fleet, req.model, req.now, rng, |_| true)
            .map(|index| Decision::new(index, Reason::LeastOutstanding))
            .ok_or_else(|| no_instance(fleet, req.model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineQueue, Fleet, InstanceSpec, RouteRequest};
    use rand::SeedableRng;

    #[test]
    fn the_engines_own_queues_count_while_fresh() {
        let fleet = Fleet::new(
            (0..3)
                .map(|i| InstanceSpec::from_url(format!("http://127.0.0.1:{}", 9000 + i)))
                .collect(),
        );
        let snap = fleet.snapshot();
        let mut rng = RouteRng::seed_from_u64(1);
        snap.instances()[0].acquire();
        // Other routers' requests on 1 and 2; 0 holds only one of ours.
        let busy = EngineQueue {
            waiting: 1,
            running: 2,
        };
        snap.instances()[1].report_others(busy, 5.0);
        snap.instances()[2].report_others(busy, 5.0);
        // Where 20 requests at `now` go.
        let mut picks = |now: f64| -> Vec<usize> {
            let mut req = RouteRequest::keyed(None, None);
            req.now = now;
            (0..20)
                .map(|_| {
                    LeastOutstanding
                        .select(&req, &snap, &mut rng)
                        .expect("routes")
                        .index
                })
                .collect()
        };
        assert!(picks(1.0).iter().all(|&i| i == 0));
        // Past the staleness bound the reports are unknown: 0 is the busiest again.
        assert!(picks(6.0).iter().all(|&i| i != 0));
        snap.instances()[0].release();
    }
}
