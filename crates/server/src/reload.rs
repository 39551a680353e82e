//! Applying membership and routing changes at run time (SIGHUP, admin API) without dropping a
//! request: instances that stay keep their in-flight counts and state; requests already sent to
//! a removed instance finish against it.

use std::sync::Arc;

use prefix_router_core::{InstanceSpec, PrefixLength, StrategyConfig};

use crate::membership::Membership;
use crate::routing::Routing;
use crate::settings::SettingsError;
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
/// with every other membership edit). Returns what `edit` returned.
pub async fn edit_members<R>(state: &AppState, edit: impl FnOnce(&mut Membership) -> R) -> R {
    let mut membership = state.membership.lock().await;
    let result = edit(&mut membership);
    state.fleet.set_members(membership.specs());
    let snapshot = state.fleet.snapshot();
    state.stats.retain(|id| snapshot.get(id).is_some());
    result
}

/// Replaces the static instance list (configuration file, flags, admin edits).
pub async fn set_members(state: &AppState, specs: Vec<InstanceSpec>) {
    edit_members(state, |m| m.static_specs = specs).await;
}

/// Installs a new strategy configuration and key length.
pub fn set_routing(
    state: &AppState,
    config: StrategyConfig,
    prefix_length: PrefixLength,
) -> Result<(), SettingsError> {
    let routing = Routing::new(config, prefix_length).map_err(|e| SettingsError::Invalid {
        field: "routing".into(),
        message: e.to_string(),
    })?;
    state.routing.store(Arc::new(routing));
    Ok(())
}

/// Reads the configuration source again and applies its instances and routing. Other settings
/// (listen addresses, limits, timeouts, health) take effect only on restart.
pub async fn reload(state: &AppState) -> Result<ReloadSummary, SettingsError> {
    let Some(source) = &state.source else {
        return Err(SettingsError::Invalid {
            field: "config".into(),
            message: "the router was started without a configuration source".into(),
        });
    };
    let settings = source.load()?;
    let now = &state.settings;
    let restart: Vec<&str> = [
        ("listen", settings.listen != now.listen),
        ("admin", settings.admin != now.admin),
        ("limits", settings.limits != now.limits),
        ("timeouts", settings.timeouts != now.timeouts),
        ("retries", settings.max_retries != now.max_retries),
        ("health", settings.health != now.health),
        ("discovery", settings.discovery != now.discovery),
        (
            "engine_metrics",
            settings.engine_metrics != now.engine_metrics,
        ),
    ]
    .into_iter()
    .filter_map(|(name, changed)| changed.then_some(name))
    .collect();
    if !restart.is_empty() {
        tracing::warn!(sections = ?restart, "these settings changed but take effect only on restart");
    }
    set_routing(state, settings.strategy.clone(), settings.prefix_length)?;
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
