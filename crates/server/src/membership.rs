//! Where the fleet's members come from: the static list (configuration file, flags, admin API
//! edits), the instances each DNS name resolves to, and the models each instance lists. Every
//! edit rebuilds the whole member list and swaps it into the fleet, so an instance that stays
//! keeps its in-flight count and state.
//!
//! Every change of an instance's state or of the member list is told to the strategy in force
//! through [`announce`] (state changes through [`transition`]), so a strategy that learns per
//! instance (cache-aware forgets what an ejected instance cached) hears of all of them.

use std::collections::{BTreeMap, HashMap};

use prefix_router_core::{Instance, InstanceId, InstanceSpec, InstanceState, MembershipChange};

use crate::state::AppState;

/// The states a drain starts from: any but draining (a drain wins over a warm-up, which only
/// ends an instance that is still warming). The admin API and Kubernetes discovery share it.
pub const DRAINABLE: [InstanceState; 4] = [
    InstanceState::Healthy,
    InstanceState::Ejected,
    InstanceState::Unknown,
    InstanceState::Warming,
];

/// Tells the strategy in force that `id` joined, left or changed state.
pub fn announce(state: &AppState, id: &InstanceId, change: MembershipChange) {
    state
        .routing
        .load()
        .strategy
        .membership(id, change, state.now_s());
}

/// Moves `inst` to `to` if it is in one of the states `from`, and tells the strategy; returns
/// false (and tells nothing) otherwise. The check and the move are one atomic step
/// ([`Instance::transition`]): the health checker and the request path can both eject the same
/// instance, and the strategy must hear of one ejection, not two (cache-aware forgets an
/// instance's blocks on each one); nor may an ejection overwrite a drain the admin API set
/// meanwhile. An instance that is no longer a member ([`is_member`]; removed while a probe or
/// a request on it was under way) changes nothing: the strategy has forgotten it, and hearing
/// of it again would make it track it anew (cache-aware took back a removed instance's slot
/// for reuse, and a late "healthy" took it out again, for good).
pub fn transition(
    state: &AppState,
    inst: &Instance,
    from: &[InstanceState],
    to: InstanceState,
) -> bool {
    if !is_member(state, inst) || !inst.transition(from, to) {
        return false;
    }
    let change = match to {
        InstanceState::Healthy => MembershipChange::Healthy,
        InstanceState::Draining => MembershipChange::Draining,
        // Back to unchecked: like an ejection, it takes nothing until a check passes.
        // Warming (prewarm replays in progress) takes nothing routed either.
        InstanceState::Ejected | InstanceState::Unknown | InstanceState::Warming => {
            MembershipChange::Ejected
        }
    };
    announce(state, inst.id(), change);
    true
}

/// Whether `inst` is still a member of the fleet: its id is, and is the same member (one whose
/// spec changed meanwhile still is; one removed and added again is not).
pub fn is_member(state: &AppState, inst: &Instance) -> bool {
    state
        .fleet
        .snapshot()
        .get(inst.id().as_str())
        .is_some_and(|(_, m)| m.same_member(inst))
}

/// The sources of the member list.
#[derive(Debug, Default, Clone)]
pub struct Membership {
    /// Configured instances (file, flags) and admin API edits.
    pub static_specs: Vec<InstanceSpec>,
    /// Instances found by each DNS target (keyed by `name:port`).
    pub dns: BTreeMap<String, Vec<InstanceSpec>>,
    /// The endpoints of the Kubernetes Service (ready and terminating ones, and members not
    /// ready for less than `unready_keep_ms`).
    pub kubernetes: Vec<InstanceSpec>,
    /// Models each instance listed at `/v1/models` (model discovery), by instance id.
    pub discovered_models: HashMap<String, Vec<String>>,
}

impl Membership {
    /// The member list: static instances first, then DNS and Kubernetes ones not already listed; each
    /// instance's models are its configured ones plus those it listed.
    pub fn specs(&self) -> Vec<InstanceSpec> {
        let mut out: Vec<InstanceSpec> = Vec::new();
        let discovered = self.dns.values().flatten().chain(&self.kubernetes);
        for spec in self.static_specs.iter().chain(discovered) {
            if out.iter().any(|s| s.id == spec.id) {
                continue;
            }
            let mut spec = spec.clone();
            if let Some(listed) = self.discovered_models.get(&spec.id) {
                for m in listed {
                    if !spec.models.contains(m) {
                        spec.models.push(m.clone());
                    }
                }
            }
            out.push(spec);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use prefix_router_core::strategies::recording::{Call, Pick, Recording};

    #[tokio::test]
    async fn the_strategy_hears_each_change_once() {
        let (a, b, c) = (
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            "http://127.0.0.1:3",
        );
        let mut settings =
            crate::settings::Settings::with_instances([a, b]).unwrap_or_else(|e| panic!("{e}"));
        // No probes here: members start healthy.
        settings.health.active = false;
        let state = AppState::new(settings, None).unwrap_or_else(|e| panic!("{e}"));
        let recorder = Arc::new(Recording::new(Pick::First));
        let current = state.routing.load_full();
        state.routing.store(Arc::new(crate::routing::Routing {
            config: current.config.clone(),
            prefix_length: current.prefix_length,
            strategy: recorder.clone(),
        }));
        let snapshot = state.fleet.snapshot();
        let inst = |id: &str| Arc::clone(snapshot.get(id).map(|(_, i)| i).expect("member"));
        let (ia, ib) = (inst(a), inst(b));
        use InstanceState::*;
        assert!(transition(&state, &ia, &[Healthy], Ejected));
        assert!(
            !transition(&state, &ia, &[Healthy], Ejected),
            "already ejected"
        );
        assert!(transition(&state, &ib, &[Healthy, Ejected], Draining));
        assert!(
            !transition(&state, &ib, &[Healthy], Ejected),
            "a drain stays"
        );
        assert!(transition(&state, &ib, &[Draining], Healthy));
        let specs = |ids: &[&str]| ids.iter().map(|u| InstanceSpec::from_url(*u)).collect();
        // b's spec changes (its models, as discovery finds them) while a check of it is under
        // way: the check's result still applies to it.
        let mut b_models = InstanceSpec::from_url(b);
        b_models.models = vec!["lora-x".into()];
        crate::reload::set_members(&state, vec![InstanceSpec::from_url(a), b_models]).await;
        assert!(transition(&state, &ib, &[Healthy], Ejected), "b's new spec");
        assert!(transition(&state, &ib, &[Ejected], Healthy));
        crate::reload::set_members(&state, specs(&[b, c])).await;
        crate::reload::set_members(&state, specs(&[b, c])).await;
        // A probe of a's that ends after a left: nothing to tell.
        assert!(
            !transition(&state, &ia, &[Ejected], Healthy),
            "a removed instance"
        );
        let told: Vec<String> = recorder
            .take()
            .into_iter()
            .filter_map(|c| match c {
                Call::Membership { instance, change } => Some(format!("{instance} {change:?}")),
                _ => None,
            })
            .collect();
        assert_eq!(
            told,
            [
                format!("{a} Ejected"),
                format!("{b} Draining"),
                format!("{b} Healthy"),
                format!("{b} Ejected"),
                format!("{b} Healthy"),
                format!("{c} Added"),
                format!("{a} Removed"),
            ]
        );
    }

    #[tokio::test]
    async fn what_a_member_that_left_listed_goes_with_it() {
        let (a, b) = ("http://127.0.0.1:1", "http://127.0.0.1:2");
        let mut settings =
            crate::settings::Settings::with_instances([a, b]).unwrap_or_else(|e| panic!("{e}"));
        settings.health.active = false;
        let state = AppState::new(settings, None).unwrap_or_else(|e| panic!("{e}"));
        crate::reload::edit_members(&state, |m| {
            m.discovered_models.insert(b.into(), vec!["lora-x".into()]);
        })
        .await;
        let models = |id: &str| {
            let snapshot = state.fleet.snapshot();
            snapshot.get(id).map(|(_, i)| i.spec().models.clone())
        };
        assert_eq!(models(b), Some(vec!["lora-x".to_string()]));
        let specs = |ids: &[&str]| ids.iter().map(|u| InstanceSpec::from_url(*u)).collect();
        crate::reload::set_members(&state, specs(&[a])).await;
        assert!(state.membership.lock().await.discovered_models.is_empty());
        // Back at the same address (a new pod): it serves what it lists, not what the old one did.
        crate::reload::set_members(&state, specs(&[a, b])).await;
        assert_eq!(models(b), Some(Vec::new()));
    }

    fn spec(url: &str, models: &[&str]) -> InstanceSpec {
        InstanceSpec {
            id: url.into(),
            url: url.into(),
            weight: 1,
            models: models.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn static_first_dns_deduplicated_models_merged() {
        let mut m = Membership {
            static_specs: vec![spec("http://a:1", &["base"])],
            ..Membership::default()
        };
        m.dns.insert(
            "svc:1".into(),
            vec![spec("http://a:1", &[]), spec("http://b:1", &[])],
        );
        m.discovered_models
            .insert("http://a:1".into(), vec!["base".into(), "lora".into()]);
        let specs = m.specs();
        assert_eq!(specs.len(), 2);
        assert_eq!(
            specs[0].models,
            vec!["base".to_string(), "lora".to_string()]
        );
        assert_eq!(specs[1].id, "http://b:1");
        assert!(specs[1].models.is_empty());
    }
}
