//! Kubernetes discovery: the instances are the endpoints of one Service, read from its
//! EndpointSlices through the API server. kube-runtime's watcher lists them, then watches from
//! the list's `resourceVersion`, resumes a watch that breaks from the last version it saw, and
//! lists again when the API server answers 410 Gone (the version is too old), with backoff.
//!
//! What an endpoint's conditions mean here, as Kubernetes defines them:
//! - ready (and not terminating): a member that takes requests (health checks still apply);
//! - terminating: a member that drains, finishing what it holds and taking nothing new, until
//!   it leaves the slice;
//! - neither: a pod starting is left out until it is ready; a member that stops being ready (its
//!   readiness probe failing under load) drains for up to `unready_keep_ms`, keeping its
//!   requests in flight and what the strategy knows of its cache, and takes requests again as
//!   soon as it is ready (one that was not healthy when it stopped being ready is checked as a
//!   new instance); past that it leaves. While the watch is failing, that time does not run
//!   out: not until a minute after its last failure (longer than the watcher waits between
//!   tries; a watch that resumes sends no event until something changes).
//!
//! A watch that fails keeps the fleet as it was: the API server being away is no reason to
//! stop routing to engines that still answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use prefix_router_core::{Instance, InstanceSpec, InstanceState};
use tokio::sync::watch;

use crate::membership;
use crate::reload::edit_members;
use crate::settings::KubernetesTarget;
use crate::state::AppState;

/// The label Kubernetes puts on a Service's EndpointSlices.
const SERVICE_LABEL: &str = "kubernetes.io/service-name";

/// Why the Kubernetes API cannot be reached at all.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    /// No in-cluster configuration and no usable kubeconfig.
    #[error("no Kubernetes configuration (not in a pod, no usable ~/.kube/config; or set discovery.kubernetes.api_server): {0}")]
    Config(#[from] kube::config::InferConfigError),
    /// The client could not be built (TLS, a bad URL).
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    /// `api_server` is not a URL.
    #[error("discovery.kubernetes.api_server: '{0}' is not a URL")]
    Url(String),
}

/// One endpoint address found in the slices, and what its conditions say.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The instance it becomes.
    pub spec: InstanceSpec,
    /// It is shutting down: drain it.
    pub terminating: bool,
    /// Neither ready nor terminating: a member keeps draining a while, a newcomer waits.
    pub unready: bool,
}

/// The client for `target`: its `api_server` (no credentials: `kubectl proxy`, tests), or the
/// in-cluster configuration, or `~/.kube/config`. Returns it with the namespace to watch.
pub async fn client(target: &KubernetesTarget) -> Result<(Client, String), KubernetesError> {
    let config = match &target.api_server {
        Some(url) => {
            let uri = url
                .parse::<http::Uri>()
                .map_err(|_| KubernetesError::Url(url.clone()))?;
            kube::Config::new(uri)
        }
        None => kube::Config::infer().await?,
    };
    let namespace = target
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    Ok((Client::try_from(config)?, namespace))
}

/// The endpoints the slices list, ready or not: an instance per endpoint, on the slice's port named `target.port` (`""`: a Service's only port, which
/// Kubernetes leaves unnamed). Addresses in several slices (an endpoint moving between slices)
/// count once, terminating if any slice says so. A dual-stack Service lists every pod in an
/// IPv4 slice and again in an IPv6 one: only one family is taken (IPv4 where it has any), or
/// each pod would be two instances, with twice its share and its cache split between them.
pub fn members<'a>(
    target: &KubernetesTarget,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Vec<Found> {
    let port_of = |slice: &EndpointSlice| {
        slice.ports.iter().flatten().find_map(|p| {
            (p.name.as_deref().unwrap_or("") == target.port)
                .then_some(p.port)
                .flatten()
        })
    };
    let slices: Vec<(&EndpointSlice, i32)> = slices
        .into_iter()
        .filter_map(|s| port_of(s).map(|p| (s, p)))
        .collect();
    let family = ["IPv4", "IPv6"]
        .into_iter()
        .find(|f| slices.iter().any(|(s, _)| s.address_type == *f));
    let mut out: BTreeMap<String, Found> = BTreeMap::new();
    for (slice, port) in slices {
        let ip = slice.address_type == "IPv4" || slice.address_type == "IPv6";
        if ip && family.is_some_and(|f| slice.address_type != f) {
            continue;
        }
        let model = target.model_label.as_ref().and_then(|l| {
            slice
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(l))
                .cloned()
        });
        let v6 = slice.address_type == "IPv6";
        for ep in &slice.endpoints {
            let (ready, terminating) = conditions(ep);
            let unready = !ready && !terminating;
            // An endpoint's addresses are one pod's, interchangeable (the API lets clients use
            // the first only): each as an instance would double the pod's share of traffic and
            // split its cache.
            for addr in ep.addresses.iter().take(1) {
                let host = if v6 {
                    format!("[{addr}]")
                } else {
                    addr.clone()
                };
                let url = format!("{}://{host}:{port}", target.scheme);
                let entry = out.entry(url.clone()).or_insert_with(|| Found {
                    spec: InstanceSpec {
                        id: url.clone(),
                        url,
                        weight: target.weight,
                        models: model.iter().cloned().collect(),
                    },
                    terminating,
                    unready,
                });
                entry.terminating |= terminating;
                // Ready in any slice: ready.
                entry.unready &= unready;
            }
        }
    }
    out.into_values().collect()
}

/// (ready, terminating), read as Kubernetes documents them: an unknown `ready` counts as ready,
/// an unknown `terminating` as not terminating.
fn conditions(ep: &Endpoint) -> (bool, bool) {
    let c = ep.conditions.as_ref();
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
    (ready && !terminating, terminating)
}

/// What the watch did to its members, remembered between lists.
#[derive(Debug, Default)]
struct Held {
    /// Ids this watch drained because they were terminating. One listed ready again (a new
    /// pod at the address of one that terminated, as with `hostNetwork` pods, where no list
    /// without the address came between) must pass a check as a new instance, not stay
    /// draining until someone un-drains it by hand.
    drained: BTreeSet<String>,
    /// Members that stopped being ready: since when, and how this watch drained them.
    unready: BTreeMap<String, (Instant, Drained)>,
    /// When the watch last failed, if it has delivered no event since: unready members do not
    /// run out of time until `watch_retry_max` after it (a failing watch keeps the fleet as it
    /// was). A watch that resumes from its version sends nothing until something changes, so
    /// no event may ever say it is back: that long without a new error is taken to.
    failing: Option<Instant>,
}

/// How a member that stopped being ready was drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// Not by this watch (the admin API, or draining already): left alone.
    NotHere,
    /// From healthy: ready again, it takes requests at once.
    FromHealthy,
    /// From unchecked, ejected or warming: ready again, it is checked (and its cache
    /// forgotten) as a new instance would be, rather than skip the check it had not passed.
    FromOther,
}

impl Held {
    /// When the next unready member's time runs out: not before `retry` after the watch's last
    /// failure.
    fn next_expiry(&self, keep: Duration, retry: Duration) -> Option<Instant> {
        let first = self
            .unready
            .values()
            .map(|(since, _)| *since + keep)
            .min()?;
        Some(self.failing.map_or(first, |at| first.max(at + retry)))
    }
}

/// Installs what the slices list: the Kubernetes members replace the previous ones, the
/// terminating ones are set to drain, and members that stopped being ready drain while
/// `unready_keep` lasts (a readiness flap must not cost the strategy what it knows of the
/// engine's cache, nor reset its count of requests in flight).
async fn apply(
    state: &AppState,
    target: &KubernetesTarget,
    slices: &BTreeMap<String, EndpointSlice>,
    held: &mut Held,
) {
    let now = Instant::now();
    let before = state.fleet.snapshot();
    let keep = target.unready_keep;
    let mut found = members(target, slices.values());
    found.retain(|f| {
        // A pod already on its way out when first seen never joins (added, then drained, it
        // could take a request in between).
        if f.terminating {
            return before.get(&f.spec.id).is_some();
        }
        if !f.unready {
            return true;
        }
        let id = &f.spec.id;
        match held.unready.get(id) {
            Some((since, _)) => now.duration_since(*since) < keep,
            None => {
                let member = before.get(id).is_some();
                let kept = !keep.is_zero() && member && !held.drained.contains(id);
                if kept {
                    held.unready.insert(id.clone(), (now, Drained::NotHere));
                }
                kept
            }
        }
    });
    // Gone from the slices, or out of time (ready again: settled below).
    held.unready
        .retain(|id, _| found.iter().any(|f| f.spec.id == *id));
    let specs: Vec<InstanceSpec> = found.iter().map(|f| f.spec.clone()).collect();
    let changed = edit_members(state, |m| {
        if m.kubernetes == specs {
            return false;
        }
        m.kubernetes = specs.clone();
        true
    })
    .await;
    let snapshot = state.fleet.snapshot();
    held.drained
        .retain(|id| found.iter().any(|f| f.spec.id == *id));
    for f in &found {
        let id = &f.spec.id;
        let Some((_, inst)) = snapshot.get(id) else {
            continue;
        };
        if f.terminating {
            // Drained already as unready, by this watch: now it is terminating.
            let ours = held
                .unready
                .remove(id)
                .is_some_and(|(_, how)| how != Drained::NotHere);
            let drained = membership::transition(
                state,
                inst,
                &membership::DRAINABLE,
                InstanceState::Draining,
            );
            if drained || ours {
                held.drained.insert(id.clone());
                tracing::info!(instance = %id, "endpoint terminating: draining");
            }
        } else if f.unready {
            let drain = |from: &[InstanceState]| {
                membership::transition(state, inst, from, InstanceState::Draining)
            };
            // Each a step of its own, so that what it was drained from is known for sure.
            let how = if drain(&[InstanceState::Healthy]) {
                Drained::FromHealthy
            } else if drain(&membership::DRAINABLE) {
                Drained::FromOther
            } else {
                Drained::NotHere
            };
            if let Some(u) = held.unready.get_mut(id).filter(|_| how != Drained::NotHere) {
                u.1 = how;
                tracing::info!(instance = %id, ?keep, "endpoint not ready: draining, kept while it may come back");
            }
        } else if let Some((since, how)) = held.unready.remove(id) {
            // An operator drained it meanwhile (already draining, so nothing moved): it stays.
            let back = match how {
                _ if state.is_held(inst) => false,
                Drained::NotHere => false,
                Drained::FromHealthy => membership::transition(
                    state,
                    inst,
                    &[InstanceState::Draining],
                    InstanceState::Healthy,
                ),
                Drained::FromOther => rejoin(state, inst),
            };
            if back {
                tracing::info!(instance = %id, after = ?since.elapsed(), "endpoint ready again: taking requests");
            }
        } else if held.drained.remove(id) && !state.is_held(inst) && rejoin(state, inst) {
            tracing::info!(instance = %id, "endpoint ready again after terminating: a new instance");
        }
    }
    if changed {
        let urls: Vec<&str> = found.iter().map(|f| f.spec.url.as_str()).collect();
        tracing::info!(service = %target.service, instances = ?urls, "Kubernetes discovery changed the fleet");
    }
}

/// A drained instance whose address came back ready: a new pod, so the strategy forgets the old
/// one's cache (an ejection), and it takes requests once a check passes (at once without
/// active checks).
fn rejoin(state: &AppState, inst: &Instance) -> bool {
    if !membership::transition(
        state,
        inst,
        &[InstanceState::Draining],
        InstanceState::Unknown,
    ) {
        return false;
    }
    if !state.settings.health.active {
        membership::transition(
            state,
            inst,
            &[InstanceState::Unknown],
            InstanceState::Healthy,
        );
    }
    true
}

fn name(s: &EndpointSlice) -> String {
    s.metadata.name.clone().unwrap_or_default()
}

/// Watches the Service's slices and keeps the fleet in step until aborted; `synced` turns true
/// once the first complete list is applied.
pub async fn run(
    state: Arc<AppState>,
    target: KubernetesTarget,
    client: Client,
    namespace: String,
    synced: watch::Sender<bool>,
) {
    let api: Api<EndpointSlice> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("{SERVICE_LABEL}={}", target.service));
    let events = watcher::watcher(api, config).default_backoff();
    futures_util::pin_mut!(events);
    let mut slices: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut held = Held::default();
    let mut listing: Option<BTreeMap<String, EndpointSlice>> = None;
    loop {
        // An unready member whose time runs out leaves without an event saying so.
        let expiry = held.next_expiry(target.unready_keep, target.watch_retry_max);
        let event = tokio::select! {
            e = events.next() => e,
            () = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                // No failure for `watch_retry_max`: the watch is back.
                held.failing = None;
                apply(&state, &target, &slices, &mut held).await;
                continue;
            }
        };
        let Some(event) = event else {
            break;
        };
        held.failing = event.is_err().then(Instant::now);
        match event {
            Ok(Event::Init) => listing = Some(BTreeMap::new()),
            Ok(Event::InitApply(s)) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(name(&s), s);
                }
            }
            Ok(Event::InitDone) => {
                if let Some(l) = listing.take() {
                    slices = l;
                }
                apply(&state, &target, &slices, &mut held).await;
                synced.send_replace(true);
            }
            Ok(Event::Apply(s)) => {
                slices.insert(name(&s), s);
                apply(&state, &target, &slices, &mut held).await;
            }
            Ok(Event::Delete(s)) => {
                slices.remove(&name(&s));
                apply(&state, &target, &slices, &mut held).await;
            }
            Err(e) => {
                tracing::warn!(service = %target.service, %namespace, error = %e,
                    "EndpointSlice watch failed; retrying with backoff, the fleet stays as it was");
            }
        }
    }
}

/// Starts watching and waits up to `first_list_timeout` for the first complete list, so that
/// the first requests find the fleet (as DNS targets are resolved once before serving).
pub async fn start(
    state: &Arc<AppState>,
    target: &KubernetesTarget,
) -> Result<tokio::task::JoinHandle<()>, KubernetesError> {
    let wait = target.first_list_timeout;
    let (client, namespace) = client(target).await?;
    let (tx, mut rx) = watch::channel(false);
    tracing::info!(service = %target.service, %namespace, port = %target.port, "watching the Service's EndpointSlices");
    let task = tokio::spawn(run(
        Arc::clone(state),
        target.clone(),
        client,
        namespace,
        tx,
    ));
    if tokio::time::timeout(wait, rx.wait_for(|s| *s))
        .await
        .is_err()
    {
        tracing::warn!(service = %target.service, ?wait, "no EndpointSlice list yet; serving meanwhile, the fleet fills in when it comes");
    }
    Ok(task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::time::Duration;

    fn target() -> KubernetesTarget {
        KubernetesTarget {
            service: "llm".into(),
            namespace: None,
            port: "http".into(),
            scheme: "http".into(),
            model_label: Some("model".into()),
            api_server: None,
            weight: 1,
            first_list_timeout: Duration::from_secs(1),
            unready_keep: Duration::from_secs(60),
            watch_retry_max: Duration::from_secs(60),
        }
    }

    fn ep(addr: &str, ready: Option<bool>, terminating: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: vec![addr.into()],
            conditions: Some(EndpointConditions {
                ready,
                serving: ready,
                terminating,
            }),
            ..Endpoint::default()
        }
    }

    fn slice(name: &str, family: &str, port: i32, endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [("model".to_string(), "llama".to_string())]
                        .into_iter()
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            address_type: family.into(),
            endpoints,
            ports: Some(vec![
                EndpointPort {
                    name: Some("metrics".into()),
                    port: Some(9000),
                    ..EndpointPort::default()
                },
                EndpointPort {
                    name: Some("http".into()),
                    port: Some(port),
                    ..EndpointPort::default()
                },
            ]),
        }
    }

    #[test]
    fn an_endpoint_with_several_addresses_is_one_instance() {
        let mut two = ep("10.0.0.1", Some(true), None);
        two.addresses.push("10.0.0.2".into());
        let found = members(&target(), [&slice("a", "IPv4", 8000, vec![two])]);
        let urls: Vec<&str> = found.iter().map(|f| f.spec.url.as_str()).collect();
        assert_eq!(urls, ["http://10.0.0.1:8000"]);
    }

    #[test]
    fn conditions_decide_membership_and_the_named_port_the_url() {
        let a = slice(
            "a",
            "IPv4",
            8000,
            vec![
                ep("10.0.0.1", Some(true), None),
                ep("10.0.0.2", Some(false), Some(false)),
                ep("10.0.0.3", Some(false), Some(true)),
                ep("10.0.0.4", None, None),
            ],
        );
        let b = slice(
            "b",
            "IPv6",
            8001,
            vec![ep("fd00::5", Some(true), Some(false))],
        );
        let urls = |found: &[Found]| -> Vec<(String, bool, bool)> {
            found
                .iter()
                .map(|f| (f.spec.url.clone(), f.terminating, f.unready))
                .collect()
        };
        let found = members(&target(), [&a]);
        assert_eq!(
            urls(&found),
            vec![
                ("http://10.0.0.1:8000".to_string(), false, false),
                ("http://10.0.0.2:8000".to_string(), false, true),
                ("http://10.0.0.3:8000".to_string(), true, false),
                ("http://10.0.0.4:8000".to_string(), false, false),
            ]
        );
        // An IPv6 Service: bracketed addresses.
        assert_eq!(
            urls(&members(&target(), [&b])),
            vec![("http://[fd00::5]:8001".to_string(), false, false)]
        );
        // Dual-stack: the same pods in both families are taken once, as IPv4.
        assert_eq!(urls(&members(&target(), [&a, &b])), urls(&found));
        assert!(found
            .iter()
            .all(|f| f.spec.models == vec!["llama".to_string()]));
        // A slice without the named port lists nothing.
        let mut other = target();
        other.port = "grpc".into();
        assert!(members(&other, [&a]).is_empty());
        // A Service's only port is unnamed (Kubernetes allows it): `port = ""` takes it.
        let mut lone = slice("c", "IPv4", 0, vec![ep("10.0.0.9", Some(true), None)]);
        lone.ports = Some(vec![EndpointPort {
            name: Some(String::new()),
            port: Some(8000),
            ..EndpointPort::default()
        }]);
        other.port = String::new();
        assert_eq!(
            urls(&members(&other, [&lone])),
            vec![("http://10.0.0.9:8000".to_string(), false, false)]
        );
        assert!(members(&target(), [&lone]).is_empty());
    }
}
