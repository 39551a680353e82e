//! Discovery: DNS names re-resolved on an interval into instances (a Kubernetes headless Service
//! works this way), and each instance's `/v1/models` asked what it serves (vLLM lists its loaded
//! LoRA adapters there), so requests for an adapter go only where it is loaded.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use prefix_router_core::{InstanceSpec, InstanceState};
use serde_json::Value;

use crate::models;
use crate::reload::edit_members;
use crate::settings::DnsTarget;
use crate::state::AppState;

/// Key of a DNS target in the membership sources.
fn key(target: &DnsTarget) -> String {
    format!("{}:{}", target.name, target.port)
}

/// The instance URL of a resolved address; `None` for scoped IPv6 addresses (no URL form).
fn url_of(addr: SocketAddr) -> Option<String> {
    match addr {
        SocketAddr::V6(v6) if v6.scope_id() != 0 => None,
        _ => Some(format!("http://{addr}")),
    }
}

/// Resolves `target` once into instance specs (sorted, without duplicates).
pub async fn resolve(target: &DnsTarget) -> std::io::Result<Vec<InstanceSpec>> {
    let addrs = tokio::net::lookup_host((target.name.as_str(), target.port)).await?;
    let mut urls: Vec<String> = addrs.filter_map(url_of).collect();
    urls.sort();
    urls.dedup();
    Ok(urls
        .into_iter()
        .map(|url| InstanceSpec {
            id: url.clone(),
            url,
            weight: target.weight,
            models: target.models.clone(),
        })
        .collect())
}

/// Resolves `target` and applies the result when it changed. A failed lookup keeps the previous
/// instances (a DNS hiccup must not empty the fleet); health checks handle instances that died.
pub async fn refresh_dns(state: &AppState, target: &DnsTarget) {
    match resolve(target).await {
        Ok(specs) => {
            let k = key(target);
            let changed = edit_members(state, |m| {
                if m.dns.get(&k) == Some(&specs) {
                    return false;
                }
                m.dns.insert(k, specs.clone());
                true
            })
            .await;
            if changed {
                let urls: Vec<&str> = specs.iter().map(|s| s.url.as_str()).collect();
                tracing::info!(name = %target.name, instances = ?urls, "DNS discovery changed the fleet");
            }
        }
        Err(e) => {
            tracing::warn!(name = %target.name, error = %e, "DNS lookup failed; keeping the instances found before");
        }
    }
}

/// Re-resolves `target` every `target.interval` until aborted.
pub async fn run_dns(state: Arc<AppState>, target: DnsTarget) {
    let mut tick = tokio::time::interval(target.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        refresh_dns(&state, &target).await;
    }
}

fn ids(items: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> = items
        .iter()
        .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Asks every instance that is not ejected for its models and applies what changed. An
/// instance that does not answer keeps what it listed before.
pub async fn refresh_models(state: &AppState) {
    let snapshot = state.fleet.snapshot();
    let asked: Vec<_> = snapshot
        .instances()
        .iter()
        .filter(|i| i.state() != InstanceState::Ejected)
        .collect();
    let answers =
        futures_util::future::join_all(asked.iter().map(|i| models::fetch(state, i))).await;
    let listed: HashMap<String, Vec<String>> = asked
        .iter()
        .zip(answers)
        .filter_map(|(i, a)| a.map(|items| (i.id().to_string(), ids(&items))))
        .collect();
    if listed.is_empty() {
        return;
    }
    let changed = {
        let m = state.membership.lock().await;
        listed
            .iter()
            .any(|(id, ids)| m.discovered_models.get(id) != Some(ids))
    };
    if changed {
        edit_members(state, |m| m.discovered_models.extend(listed)).await;
        tracing::info!("model discovery changed what the instances serve");
    }
}

/// Runs model discovery every `interval` until aborted.
pub async fn run_models(state: Arc<AppState>, interval: std::time::Duration) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        refresh_models(&state).await;
    }
}
