//! Applying membership and routing changes at run time (SIGHUP, admin API) without dropping a
//! request: instances that stay keep their in-flight counts and state; requests already sent to
//! a removed instance finish against it.

use std::sync::Arc;

use prefix_router_core::{
    ConfigError, InstanceSpec, InstanceState, MembershipChange, PrefixLength, StrategyConfig,
};

use crate::membership::{self, Membership};
use crate::settings::{Settings, SettingsError};
use crate::state::AppState;

/// What a reload changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadSummary {
    /// Instances in the fleet afterwards.
    pub instances: usize,
    /// Strategy in force afterwards.
    pub strategy: &'static str,
}

/// Edits the membership sources and applies the resulting member list to the fleet (serialized
/// with every other membership edit), telling the strategy which instances joined and left.
/// Returns what `edit` returned.
pub async fn edit_members<R>(state: &AppState, edit: impl FnOnce(&mut Membership) -> R) -> R {
    let mut membership = state.membership.lock().await;
    let result = edit(&mut membership);
    let specs = membership.specs();
    // What a member that left had listed goes with it: kept, it grew with every pod that ever
    // came and went, and a pod that reused the address would have served its models.
    membership
        .discovered_models
        .retain(|id, _| specs.iter().any(|s| s.id == *id));
    let before = state.fleet.snapshot();
    // A member that will be prewarmed joins warming: nothing is routed to it before. Only
    // while some member that stays takes requests: when none does (a Recreate rollout, a
    // scale-up from zero, a list of endpoints briefly empty), warming every newcomer kept the
    // whole fleet unroutable, 503 for every request, for up to the warm-up budget.
    let warm = before
        .eligible(None)
        .any(|(_, i)| specs.iter().any(|s| s.id == i.id().as_str()));
    match state.prewarm.as_ref().filter(|p| warm && p.has_traffic()) {
        Some(_) => state
            .fleet
            .set_members_joining(specs, InstanceState::Warming),
        None => state.fleet.set_members(specs),
    }
    let after = state.fleet.snapshot();
    // Still under the membership lock: announcements go out in the order the edits happened.
    for inst in after.instances() {
        if before.get(inst.id().as_str()).is_none() {
            membership::announce(state, inst.id(), MembershipChange::Added);
            if let Some(p) = &state.prewarm {
                p.joined(state, inst, warm);
            }
        }
    }
    for inst in before.instances() {
        if after.get(inst.id().as_str()).is_none() {
            membership::announce(state, inst.id(), MembershipChange::Removed);
            state
                .metrics
                .forget_instance(&state.stats.get(inst).series, &inst.id().0);
        }
    }
    state
        .stats
        .retain(|key| after.instances().iter().any(|i| i.id_hash() == key));
    result
}

/// Replaces the static instance list (configuration file, flags, admin edits).
pub async fn set_members(state: &AppState, specs: Vec<InstanceSpec>) {
    edit_members(state, |m| m.static_specs = specs).await;
}

/// Installs a strategy configuration and key length. An unchanged strategy configuration keeps
/// the strategy in force, with what it learned ([`crate::routing::Routing::replaced_by`]).
pub fn set_routing(
    state: &AppState,
    config: StrategyConfig,
    prefix_length: PrefixLength,
) -> Result<(), ConfigError> {
    loop {
        let current = state.routing.load_full();
        let next = Arc::new(current.replaced_by(config.clone(), prefix_length)?);
        // Compare-and-swap: if a concurrent change (admin API and SIGHUP at once) got in first,
        // redo the comparison against its result instead of overwriting it with a stale one.
        let previous = state.routing.compare_and_swap(&current, next);
        if Arc::ptr_eq(&previous, &current) {
            return Ok(());
        }
    }
}

/// The sections of `new` that differ from `now` and that a reload does not apply (they take
/// effect on restart): said in the log, so a changed key is never ignored silently. Every field
/// is named here, so a new section cannot be left out ([`kv_events`](Settings::kv_events) and
/// [`prewarm`](Settings::prewarm) were, and a change to them was dropped without a word).
fn needs_restart(new: &Settings, now: &Settings) -> Vec<&'static str> {
    let Settings {
        listen,
        admin,
        // Applied by the reload.
        routing: _,
        limits,
        timeouts,
        retries,
        health,
        discovery,
        engine_metrics,
        access_log,
        kv_events,
        prewarm,
        tls,
        upstream_tls,
        // Applied by the reload.
        instances: _,
    } = new;
    [
        ("listen", *listen != now.listen),
        ("tls", *tls != now.tls),
        ("upstream_tls", *upstream_tls != now.upstream_tls),
        ("admin", *admin != now.admin),
        ("limits", *limits != now.limits),
        ("timeouts", *timeouts != now.timeouts),
        ("retries", *retries != now.retries),
        ("health", *health != now.health),
        ("discovery", *discovery != now.discovery),
        ("access_log", *access_log != now.access_log),
        ("kv_events", *kv_events != now.kv_events),
        ("prewarm", *prewarm != now.prewarm),
        ("engine_metrics", *engine_metrics != now.engine_metrics),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect()
}

/// Reads the configuration source again and applies its instances and routing. Other settings
/// (listen addresses, limits, timeouts, health) take effect only on restart.
pub async fn reload(state: &AppState) -> Result<ReloadSummary, SettingsError> {
    // The log file first, whatever the configuration says: logrotate moved it away and sent
    // SIGHUP, and a bad configuration must not keep the router writing to the moved file.
    if let Some(log) = &state.access_log {
        log.reopen();
    }
    let Some(source) = &state.source else {
        return Err(SettingsError::Invalid {
            field: "config".into(),
            message: "the router was started without a configuration source".into(),
        });
    };
    let settings = source.load()?;
    let restart = needs_restart(&settings, &state.settings);
    if !restart.is_empty() {
        tracing::warn!(sections = ?restart, "these settings changed but take effect only on restart");
    }
    // TLS files first, each tried whatever the other did: the listener's certificate, and the
    // instances' CA bundle and client certificate (mutual TLS), read again from the same files
    // (a rotation). A bad file keeps the one in force and fails the reload with the field
    // named, before any new instance is let in (it would be reached with the old CA).
    let listener = state
        .tls
        .as_ref()
        .map_or(Ok(()), crate::tls::Listener::reload);
    let upstream = state.upstream_tls.reload();
    listener.and(upstream)?;
    set_routing(
        state,
        settings.routing.strategy.clone(),
        settings.routing.prefix_length,
    )?;
    crate::kv_events::warn_if_blind(state);
    set_members(state, settings.instances).await;
    let summary = ReloadSummary {
        instances: state.fleet.snapshot().len(),
        strategy: state.routing.load().strategy.name(),
    };
    tracing::info!(
        instances = summary.instances,
        strategy = summary.strategy,
        "configuration reloaded"
    );
    Ok(summary)
}

#[cfg(test)]
mod restart_tests {
    use super::*;

    #[test]
    fn every_section_a_reload_does_not_apply_is_named() {
        let now = Settings::default();
        assert!(needs_restart(&now, &now).is_empty());
        let mut new = Settings::default();
        new.kv_events.subscribe = !now.kv_events.subscribe;
        new.prewarm.enabled = !now.prewarm.enabled;
        new.retries.max_retries += 1;
        new.instances
            .push(prefix_router_core::InstanceSpec::from_url(
                "http://127.0.0.1:1",
            ));
        assert_eq!(
            needs_restart(&new, &now),
            ["retries", "kv_events", "prewarm"]
        );
    }
}
