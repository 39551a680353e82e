//! Discovery: DNS names re-resolved on an interval into instances (A/AAAA records, as of a
//! Kubernetes headless Service, or SRV records, as Kubernetes and Consul publish them), and each instance's `/v1/models` asked what it serves (vLLM lists its loaded
//! LoRA adapters there), so requests for an adapter go only where it is loaded.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::rdata::SRV;
use hickory_resolver::proto::rr::{Name, RData};
use hickory_resolver::{Resolver, TokioResolver};

use prefix_router_core::{InstanceSpec, InstanceState};
use serde_json::Value;

use crate::models;
use crate::reload::edit_members;
use crate::settings::{DnsRecord, DnsTarget};
use crate::state::AppState;

/// Key of a DNS target in the membership sources.
fn key(target: &DnsTarget) -> String {
    match (target.record, target.server) {
        (DnsRecord::Address, None) => format!("{}:{}", target.name, target.port),
        (DnsRecord::Address, Some(s)) => format!("{}:{}@{s}", target.name, target.port),
        (DnsRecord::Srv, None) => format!("srv {}", target.name),
        (DnsRecord::Srv, Some(s)) => format!("srv {}@{s}", target.name),
    }
}

/// The instance URL of a resolved address; `None` for scoped IPv6 addresses (no URL form).
fn url_of(addr: SocketAddr) -> Option<String> {
    match addr {
        SocketAddr::V6(v6) if v6.scope_id() != 0 => None,
        _ => Some(format!("http://{addr}")),
    }
}

/// Why a DNS target could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The system resolver failed (A/AAAA without a configured server).
    #[error("{0}")]
    System(#[from] std::io::Error),
    /// The DNS client failed: no answer, a refusal, a name that does not exist.
    #[error("{0}")]
    Dns(#[from] hickory_resolver::net::NetError),
    /// `/etc/resolv.conf` could not be read (SRV without a configured server).
    #[error("cannot read the system's DNS configuration: {0}")]
    SystemConfig(String),
}

/// One DNS target and the client that asks for it, built once: a configured name server, or
/// for SRV records the system's (`/etc/resolv.conf`); plain A/AAAA lookups without a server go
/// through the C library (so `/etc/hosts` and nsswitch apply, as for any other program).
pub struct DnsSource {
    target: DnsTarget,
    client: Option<TokioResolver>,
}

impl DnsSource {
    /// The client for `target`.
    pub fn new(target: &DnsTarget) -> Result<Self, DiscoveryError> {
        let builder = match (target.server, target.record) {
            (None, DnsRecord::Address) => None,
            (Some(server), _) => {
                let mut ns = NameServerConfig::udp_and_tcp(server.ip());
                for c in &mut ns.connections {
                    c.port = server.port();
                }
                Some(Resolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![ns]),
                    TokioRuntimeProvider::default(),
                ))
            }
            (None, DnsRecord::Srv) => Some(
                TokioResolver::builder_tokio()
                    .map_err(|e| DiscoveryError::SystemConfig(e.to_string()))?,
            ),
        };
        let client = builder.map(|mut b| {
            let opts = b.options_mut();
            // Every interval asks the server: the interval is the operator's knob for how
            // soon a change is seen, not the records' TTL in a cache of ours.
            opts.cache_size = 0;
            opts.timeout = target.interval.min(Duration::from_secs(5));
            opts.attempts = 1;
            b.build()
        });
        Ok(Self {
            target: target.clone(),
            client: client.transpose()?,
        })
    }

    /// The target it resolves.
    pub fn target(&self) -> &DnsTarget {
        &self.target
    }

    /// Resolves the target once into instance specs (sorted, without duplicates).
    pub async fn resolve(&self) -> Result<Vec<InstanceSpec>, DiscoveryError> {
        let t = &self.target;
        // Each address with the SRV record's weight (1 for A/AAAA records).
        let addrs: Vec<(SocketAddr, u16)> = match (&self.client, t.record) {
            (None, _) => tokio::net::lookup_host((t.name.as_str(), t.port))
                .await?
                .map(|a| (a, 1))
                .collect(),
            (Some(c), DnsRecord::Address) => c
                .lookup_ip(t.name.as_str())
                .await?
                .iter()
                .map(|ip| (SocketAddr::new(ip, t.port), 1))
                .collect(),
            (Some(c), DnsRecord::Srv) => srv_addrs(c, &t.name).await?,
        };
        let mut found: Vec<(String, u16)> = one_family(addrs)
            .into_iter()
            .filter_map(|(a, w)| Some((url_of(a)?, w)))
            .collect();
        // One instance per URL: of two records naming the same address, the heavier counts.
        found.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        found.dedup_by(|a, b| a.0 == b.0);
        Ok(found
            .into_iter()
            .map(|(url, w)| InstanceSpec {
                id: url.clone(),
                url,
                weight: t.weight.saturating_mul(u32::from(w.max(1))),
                models: t.models.clone(),
            })
            .collect())
    }
}

/// The IPv4 addresses when there are any, else all: a dual-stack headless Service answers an A
/// and an AAAA record for every pod (and SRV glue both), and each pod became two instances,
/// with twice its share and its cache affinity split between them.
fn one_family<T>(addrs: Vec<(SocketAddr, T)>) -> Vec<(SocketAddr, T)> {
    if addrs.iter().any(|(a, _)| a.is_ipv4()) {
        addrs.into_iter().filter(|(a, _)| a.is_ipv4()).collect()
    } else {
        addrs
    }
}

/// The SRV records' targets at their ports: their addresses from the answer's additional
/// section when the server sent them there (Kubernetes and Consul do), else looked up. Only
/// the records of the lowest priority value with a target that resolves count (RFC 2782: a
/// higher value is a backup, such as another site, used only when none of those answers). A
/// target that does not resolve is left out (the others still count); none resolving is an
/// error. Each address comes with its record's weight (RFC 2782: the share of requests among the
/// records of one priority), which multiplies the target's `weight`; a weight of 0 (a record
/// that should see only a little traffic) counts as 1, so 0 beside 100 is a share of 1%.
async fn srv_addrs(
    c: &TokioResolver,
    name: &str,
) -> Result<Vec<(SocketAddr, u16)>, DiscoveryError> {
    let lookup = c.srv_lookup(name).await?;
    let mut glue: HashMap<Name, Vec<IpAddr>> = HashMap::new();
    for r in lookup.additionals() {
        match &r.data {
            RData::A(a) => glue.entry(r.name.clone()).or_default().push(a.0.into()),
            RData::AAAA(a) => glue.entry(r.name.clone()).or_default().push(a.0.into()),
            _ => {}
        }
    }
    let records: Vec<&SRV> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some(srv),
            _ => None,
        })
        .collect();
    let mut priorities: Vec<u16> = records.iter().map(|s| s.priority).collect();
    priorities.sort_unstable();
    priorities.dedup();
    let mut out = Vec::new();
    let mut last_err = None;
    for priority in priorities {
        for srv in records.iter().filter(|s| s.priority == priority) {
            let ips = match glue.get(&srv.target) {
                Some(ips) => ips.clone(),
                None => match c.lookup_ip(srv.target.clone()).await {
                    Ok(found) => found.iter().collect(),
                    Err(e) => {
                        last_err = Some(e);
                        continue;
                    }
                },
            };
            out.extend(
                ips.into_iter()
                    .map(|ip| (SocketAddr::new(ip, srv.port), srv.weight)),
            );
        }
        if !out.is_empty() {
            break;
        }
    }
    match (out.is_empty(), last_err) {
        (true, Some(e)) => Err(e.into()),
        _ => Ok(out),
    }
}

/// Resolves the target and applies the result when it changed. A failed lookup keeps the
/// previous instances (a DNS hiccup must not empty the fleet); health checks handle instances
/// that died.
pub async fn refresh_dns(state: &AppState, source: &DnsSource) {
    let target = source.target();
    match source.resolve().await {
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

/// Re-resolves the target every `interval` until aborted.
pub async fn run_dns(state: Arc<AppState>, source: DnsSource) {
    let mut tick = tokio::time::interval(source.target().interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        refresh_dns(&state, &source).await;
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

#[cfg(test)]
mod family_tests {
    use super::*;

    #[test]
    fn a_dual_stack_answer_is_taken_once_as_ipv4() {
        let a = |s: &str| {
            let addr = s
                .parse::<SocketAddr>()
                .unwrap_or_else(|e| panic!("{s}: {e}"));
            (addr, 1u16)
        };
        let both = vec![a("10.0.0.1:8000"), a("[fd00::1]:8000"), a("10.0.0.2:8000")];
        assert_eq!(
            one_family(both),
            vec![a("10.0.0.1:8000"), a("10.0.0.2:8000")]
        );
        let v6 = vec![a("[fd00::1]:8000"), a("[fd00::2]:8000")];
        assert_eq!(one_family(v6.clone()), v6);
    }
}
