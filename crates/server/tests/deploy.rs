//! The deployment files as a cluster would read them: every manifest under
//! `deploy/kubernetes/` parses as the Kubernetes type its `kind` names, with no field that
//! type does not have (each is decoded with k8s-openapi and encoded again, and must come back
//! the same: a misspelt or misplaced field is dropped on the way and fails here), kustomize
//! lists every file, the ConfigMap's router.toml is a valid configuration that discovers
//! through Kubernetes, and what the Deployment promises holds: 2 replicas, readiness and
//! liveness on `/health`, a drain that fits the grace period, RBAC that only reads
//! EndpointSlices, a non-root container. The Dockerfile is checked for its stages and user.

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn documents(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Decodes `doc` as `T` and checks that encoding it again gives `doc` back.
fn strict<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let back = serde_json::to_value(&typed).unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Some(path) = difference(doc, &back, String::new()) {
        panic!("{what}: `{path}` is not a field of the type (misspelt, or in the wrong place)");
    }
    typed
}

/// The path of the first place where `written` has something `read` lost.
fn difference(written: &Value, read: &Value, path: String) -> Option<String> {
    match (written, read) {
        (Value::Object(a), Value::Object(b)) => a.iter().find_map(|(k, v)| match b.get(k) {
            None => Some(format!("{path}.{k}")),
            Some(w) => difference(v, w, format!("{path}.{k}")),
        }),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, w))| difference(v, w, format!("{path}[{i}]"))),
        (a, b) if a == b => None,
        _ => Some(path),
    }
}

struct Manifests {
    deployment: Option<Deployment>,
    config: Option<ConfigMap>,
    role: Option<Role>,
    binding: Option<RoleBinding>,
    service: Option<Service>,
    account: Option<ServiceAccount>,
}

fn load() -> (Manifests, Vec<String>) {
    let dir = repo().join("deploy/kubernetes");
    let mut m = Manifests {
        deployment: None,
        config: None,
        role: None,
        binding: None,
        service: None,
        account: None,
    };
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    entries.sort();
    for file in entries {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == "kustomization.yaml" {
            continue;
        }
        files.push(name.clone());
        for doc in documents(&file) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let what = format!("{name}: {kind}");
            match kind.as_str() {
                "Deployment" => m.deployment = Some(strict(&doc, &what)),
                "ConfigMap" => m.config = Some(strict(&doc, &what)),
                "Role" => m.role = Some(strict(&doc, &what)),
                "RoleBinding" => m.binding = Some(strict(&doc, &what)),
                "Service" => m.service = Some(strict(&doc, &what)),
                "ServiceAccount" => m.account = Some(strict(&doc, &what)),
                other => panic!("{name}: kind {other:?} is not checked here; add it"),
            }
        }
    }
    (m, files)
}

#[test]
fn the_manifests_are_what_kubernetes_reads_and_do_what_they_say() {
    let (m, files) = load();
    // kustomize applies every file, and only files that exist.
    let kustomization = &documents(&repo().join("deploy/kubernetes/kustomization.yaml"))[0];
    let mut listed: Vec<String> = kustomization["resources"]
        .as_array()
        .map(|r| {
            r.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    listed.sort();
    assert_eq!(listed, files, "kustomization.yaml's resources");

    let d = m.deployment.expect("a Deployment");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.expect("pod spec");
    let c = &pod.containers[0];
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        p.as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|h| h.path.clone())
    };
    // Not /ready: that one follows the engines, and would take every replica out of the
    // Service during an engine outage.
    assert_eq!(probe_path(&c.readiness_probe).as_deref(), Some("/health"));
    assert_eq!(probe_path(&c.liveness_probe).as_deref(), Some("/health"));
    let pod_security = pod.security_context.as_ref().expect("pod security context");
    assert_eq!(pod_security.run_as_non_root, Some(true));
    let sc = c
        .security_context
        .as_ref()
        .expect("container security context");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));

    // The configuration it mounts is valid, discovers through Kubernetes, listens where the
    // probes and the Service look, and drains within the grace period.
    let cm = m.config.expect("a ConfigMap");
    let toml = cm
        .data
        .as_ref()
        .and_then(|d| d.get("router.toml"))
        .expect("router.toml");
    let settings =
        prefix_router_server::settings::settings_from_text(toml, Path::new("router.toml"))
            .unwrap_or_else(|e| panic!("the ConfigMap's router.toml: {e}"));
    assert!(settings.discovery.kubernetes.is_some());
    // Behind a Service every client is a few proxies' addresses, and the pod has no CPU limit
    // for the default (one I/O thread per node CPU) to follow.
    assert_eq!(settings.limits.max_connections_per_client, None);
    assert_eq!(settings.limits.io_threads, 2);
    let port = i32::from(settings.listen.port());
    assert!(c
        .ports
        .iter()
        .flatten()
        .any(|p| p.container_port == port && p.name.as_deref() == Some("http")));
    let pre_stop = c
        .lifecycle
        .as_ref()
        .and_then(|l| l.pre_stop.as_ref())
        .and_then(|h| h.sleep.as_ref())
        .map_or(0, |s| s.seconds);
    let grace = pod
        .termination_grace_period_seconds
        .expect("terminationGracePeriodSeconds");
    let drain = i64::try_from(settings.timeouts.shutdown_grace.as_secs()).unwrap_or(i64::MAX);
    assert!(
        pre_stop + drain < grace,
        "preStop {pre_stop} s + drain {drain} s must fit in {grace} s"
    );
    let mounted = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.config_map.as_ref())
        .any(|v| v.name == cm.metadata.name.clone().unwrap_or_default());
    assert!(mounted, "the Deployment mounts the ConfigMap");

    // RBAC: read EndpointSlices, nothing else, bound to the account the pods run as.
    let role = m.role.expect("a Role");
    for rule in role.rules.iter().flatten() {
        assert_eq!(
            rule.api_groups.as_deref(),
            Some(&["discovery.k8s.io".to_string()][..])
        );
        assert_eq!(
            rule.resources.as_deref(),
            Some(&["endpointslices".to_string()][..])
        );
        let mut verbs = rule.verbs.clone();
        verbs.sort();
        assert_eq!(verbs, ["get", "list", "watch"]);
    }
    let binding = m.binding.expect("a RoleBinding");
    let account = m
        .account
        .expect("a ServiceAccount")
        .metadata
        .name
        .expect("named");
    assert_eq!(pod.service_account_name.as_deref(), Some(account.as_str()));
    assert!(binding.subjects.iter().flatten().any(|s| s.name == account));
    assert_eq!(
        binding.role_ref.name,
        role.metadata.name.unwrap_or_default()
    );

    // The Service reaches the pods' http port.
    let svc = m.service.expect("a Service").spec.expect("spec");
    let selector = svc.selector.expect("selector");
    let labels = spec
        .template
        .metadata
        .and_then(|m| m.labels)
        .expect("pod labels");
    assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)));
}

#[test]
fn the_image_is_multi_stage_distroless_and_not_root() {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let froms: Vec<&str> = text.lines().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(froms.len(), 2, "{froms:?}");
    assert!(
        froms[1].contains("distroless") && froms[1].contains("nonroot"),
        "{}",
        froms[1]
    );
    assert!(text.lines().any(|l| l.trim() == "USER nonroot:nonroot"));
    assert!(
        text.contains("--locked"),
        "the image builds what Cargo.lock pins"
    );
    // The image ships the production build: a profile Cargo.toml defines, copied from its own
    // output folder (a renamed profile would otherwise copy nothing, or an older binary).
    let profile = text
        .split_whitespace()
        .skip_while(|w| *w != "--profile")
        .nth(1)
        .expect("the image names its cargo profile");
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        manifest.contains(&format!("[profile.{profile}]")),
        "Cargo.toml has no profile {profile}"
    );
    assert!(
        text.contains(&format!("target/{profile}/prefix-router")),
        "the image copies the binary of the profile it built ({profile})"
    );
}
