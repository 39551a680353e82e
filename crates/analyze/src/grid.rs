//! The settings a sweep tries: the baselines, `prefix-aware` over prefix length × overflow
//! threshold, the main knobs of `cache-aware`, and today's setting wherever it is not already
//! among them.

use std::collections::BTreeMap;

use prefix_router_core::strategy::OverflowPolicy;
use prefix_router_core::{
    ChainSpec, ConcurrencyThreshold, PrefixLength, StrategyConfig, StrategyKind,
};

/// Prefix lengths `prefix-aware` is tried at (characters).
pub const PREFIX_LENGTHS: [usize; 3] = [1024, 4096, 16384];
/// Overflow thresholds it is tried at (in-flight requests): the default and a loose one. Under
/// load, long answers keep many requests in flight on every instance, and at the default a hot
/// key overflows to instances without its prefix; a tighter one only overflows more. Each
/// value costs three simulations a prefix length.
pub const THRESHOLDS: [u32; 2] = [32, 128];
/// `cache-aware` variants beside its defaults: its share bound off and looser, and wider ties
/// (more locality at some queueing).
pub const CACHE_AWARE_VARIANTS: [(&str, &str); 3] = [
    ("max-share", "0"),
    ("max-share", "1.5"),
    ("tie-tolerance", "0.3"),
];

/// One routing setting: a strategy with its settings and the key's prefix length.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Setting {
    /// Strategy name.
    pub strategy: String,
    /// Characters of the routing key.
    pub prefix_length: usize,
    /// `prefix-aware`'s overflow threshold (`None` for strategies without one).
    pub concurrency_threshold: Option<u32>,
    /// The strategy's own parameters, as set.
    pub params: BTreeMap<String, String>,
    /// What the simulator builds.
    #[serde(skip)]
    pub config: StrategyConfig,
    /// How the strategy cuts block chains, if it reads them (asked of the built strategy once,
    /// here; `None` also when the configuration does not build, which the sweep reports).
    #[serde(skip)]
    pub chain_spec: Option<ChainSpec>,
}

impl Setting {
    /// A setting from a strategy's configuration and the key's prefix length.
    pub fn new(config: StrategyConfig, prefix_length: PrefixLength) -> Self {
        let thresholded = config.kind.name() == "prefix-aware";
        Setting {
            strategy: config.kind.name().to_string(),
            prefix_length: prefix_length.get(),
            concurrency_threshold: thresholded.then(|| config.concurrency_threshold.get()),
            params: config.params.clone(),
            chain_spec: config.build().ok().and_then(|s| s.chain_spec()),
            config,
        }
    }

    /// How the report names it: the strategy and what was set.
    pub fn label(&self) -> String {
        let mut out = self.strategy.clone();
        if let Some(t) = self.concurrency_threshold {
            out.push_str(&format!(" len={} t={t}", self.prefix_length));
            if self.config.overflow == OverflowPolicy::LeastOutstanding {
                out.push_str(" overflow=least-outstanding");
            }
            if let Some(c) = self.config.balance_factor {
                out.push_str(&format!(" c={c}"));
            }
        }
        for (k, v) in &self.params {
            out.push_str(&format!(" {k}={v}"));
        }
        out
    }

    /// Whether the strategy reads block chains (the costlier kind to simulate).
    pub fn reads_chains(&self) -> bool {
        self.chain_spec.is_some()
    }

    /// The same routing: same strategy settings and, where the strategy reads the key, the same
    /// prefix length.
    pub fn same_as(&self, other: &Setting) -> bool {
        self.config == other.config
            && (self.concurrency_threshold.is_none() || self.prefix_length == other.prefix_length)
    }
}

/// The sweep's settings: the baselines first, then `prefix-aware`, then `cache-aware`, then
/// `current` if none of those is the same. Strategies without a key use `current`'s prefix
/// length.
pub fn grid(current: &Setting) -> Vec<Setting> {
    let base_len = PrefixLength::new(current.prefix_length as u64).unwrap_or_default();
    let mut out = Vec::new();
    for name in ["random", "least-outstanding"] {
        if let Some(k) = StrategyKind::named(name) {
            out.push(Setting::new(StrategyConfig::new(k), base_len));
        }
    }
    if let Some(k) = StrategyKind::named("prefix-aware") {
        for len in PREFIX_LENGTHS {
            for t in THRESHOLDS {
                let (Ok(len), Ok(t)) = (
                    PrefixLength::new(len as u64),
                    ConcurrencyThreshold::new(u64::from(t)),
                ) else {
                    continue;
                };
                let mut c = StrategyConfig::new(k);
                c.concurrency_threshold = t;
                out.push(Setting::new(c, len));
            }
        }
    }
    if let Some(k) = StrategyKind::named("cache-aware") {
        out.push(Setting::new(StrategyConfig::new(k), base_len));
        for (param, value) in CACHE_AWARE_VARIANTS {
            let mut c = StrategyConfig::new(k);
            c.params.insert(param.to_string(), value.to_string());
            out.push(Setting::new(c, base_len));
        }
    }
    if !out.iter().any(|s| s.same_as(current)) {
        out.push(current.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grid_holds_its_baselines_and_adds_current_once() {
        let ca = StrategyKind::named("cache-aware").expect("registered");
        let default = Setting::new(StrategyConfig::new(ca), PrefixLength::default());
        let g = grid(&default);
        assert_eq!(g.len(), 2 + 6 + 4, "current is the cache-aware default");
        assert!(g.iter().any(|s| s.label() == "prefix-aware len=4096 t=128"));
        assert!(g.iter().any(|s| s.label() == "cache-aware max-share=1.5"));
        let mut odd = StrategyConfig::new(ca);
        odd.params.insert("decode-chars".into(), "512".into());
        let odd = Setting::new(odd, PrefixLength::default());
        let g = grid(&odd);
        assert_eq!(g.len(), 13);
        assert_eq!(
            g.last().map(Setting::label).as_deref(),
            Some("cache-aware decode-chars=512")
        );
    }
}
