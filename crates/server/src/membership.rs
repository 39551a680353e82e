//! Where the fleet's members come from: the static list (configuration file, flags, admin API
//! edits), the instances each DNS name resolves to, and the models each instance lists. Every
//! edit rebuilds the whole member list and swaps it into the fleet, so an instance that stays
//! keeps its in-flight count and state.

use std::collections::{BTreeMap, HashMap};

use prefix_router_core::InstanceSpec;

/// The sources of the member list.
#[derive(Debug, Default, Clone)]
pub struct Membership {
    /// Configured instances (file, flags) and admin API edits.
    pub static_specs: Vec<InstanceSpec>,
    /// Instances found by each DNS target (keyed by `name:port`).
    pub dns: BTreeMap<String, Vec<InstanceSpec>>,
    /// Models each instance listed at `/v1/models` (model discovery), by instance id.
    pub discovered_models: HashMap<String, Vec<String>>,
}

impl Membership {
    /// The member list: static instances first, then DNS ones not already listed; each
    /// instance's models are its configured ones plus those it listed.
    pub fn specs(&self) -> Vec<InstanceSpec> {
        let mut out: Vec<InstanceSpec> = Vec::new();
        for spec in self.static_specs.iter().chain(self.dns.values().flatten()) {
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
