//! Selection helpers shared by the strategies: eligibility errors, k-th eligible instance and
//! least-outstanding with random tie-breaking. None of them allocates.

use crate::{FleetSnapshot, Instance, RouteError, RouteRng};
use rand::Rng;

/// The error to return when no eligible healthy instance exists for `model`: a model that some
/// member serves (in whatever state) is unavailable, one that none serves is not served. An
/// empty fleet is an outage whatever the request names.
pub fn no_instance(fleet: &FleetSnapshot, model: Option<&str>) -> RouteError {
    match model {
        _ if fleet.is_empty() => RouteError::NoHealthyInstance,
        Some(m) if fleet.instances().iter().any(|i| i.serves(Some(m))) => {
            RouteError::ModelUnavailable(m.to_string())
        }
        Some(m) => RouteError::ModelNotServed(m.to_string()),
        None => RouteError::NoHealthyInstance,
    }
}

/// Number of instances that may take a request for `model`.
pub(crate) fn count_eligible(fleet: &FleetSnapshot, model: Option<&str>) -> usize {
    fleet
        .instances()
        .iter()
        .filter(|i| i.is_eligible(model))
        .count()
}

/// Index (into the snapshot) of the `k`-th eligible instance, counting from 0.
pub(crate) fn nth_eligible(fleet: &FleetSnapshot, model: Option<&str>, k: usize) -> Option<usize> {
    fleet.eligible(model).nth(k).map(|(i, _)| i)
}

/// Among eligible instances accepted by `accept`, the one with the least [load](Instance::load)
/// at `now`; ties are
/// broken uniformly at random (reservoir sampling over the tied ones, one pass, no allocation),
/// so an idle fleet does not send every request to the first instance.
pub(crate) fn least_outstanding(
    fleet: &FleetSnapshot,
    model: Option<&str>,
    now: f64,
    rng: &mut RouteRng,
    mut accept: impl FnMut(&Instance) -> bool,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut best_load = u32::MAX;
    let mut ties = 0u32;
    for (i, inst) in fleet.eligible(model) {
        if !accept(inst) {
            continue;
        }
        let load = inst.load(now);
        if best.is_none() || load < best_load {
            best = Some(i);
            best_load = load;
            ties = 1;
        } else if load == best_load {
            ties += 1;
            if rng.gen_range(0..ties) == 0 {
                best = Some(i);
            }
        }
    }
    best
}
