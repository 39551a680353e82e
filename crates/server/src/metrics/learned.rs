//! What the strategy in force has learned ([`Strategy::stats`]), exported at scrape time.
//!
//! Every series carries a `strategy` label and is rebuilt on each scrape from the strategy in
//! force, so a strategy without learned state (prefix-aware, ...) exports none of them, and a
//! replaced strategy's series disappear. The totals are counters that restart from zero when the
//! strategy is rebuilt (a configuration change); Prometheus treats that as a counter reset.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prefix_router_core::{Strategy, StrategyStats};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// `strategy`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StrategyLabels {
    /// Strategy name.
    pub strategy: &'static str,
}

/// `strategy, blocks`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MatchLabels {
    /// Strategy name.
    pub strategy: &'static str,
    /// Matched length range in blocks: `0`, `1`, `2-3`, `4-7`, ..., `N+`.
    pub blocks: String,
}

/// A counter whose total is kept elsewhere (by the strategy) and copied in at scrape time. The
/// client library's `Counter` only goes up by increments, which cannot follow a total that
/// restarts when the strategy is rebuilt.
#[derive(Debug, Default, Clone)]
pub struct CopiedCounter(Arc<AtomicU64>);

impl CopiedCounter {
    /// Sets the total.
    pub fn set(&self, total: u64) {
        self.0.store(total, Ordering::Relaxed);
    }
}

impl TypedMetric for CopiedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for CopiedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.0.load(Ordering::Relaxed), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The learned-state metrics.
#[derive(Debug, Default)]
pub struct Learned {
    index_blocks: Family<StrategyLabels, Gauge>,
    index_budget_blocks: Family<StrategyLabels, Gauge>,
    index_bytes: Family<StrategyLabels, Gauge>,
    predicted: Family<StrategyLabels, CopiedCounter>,
    reported: Family<StrategyLabels, CopiedCounter>,
    ratio: Family<StrategyLabels, Gauge<f64, AtomicU64>>,
    match_blocks: Family<MatchLabels, CopiedCounter>,
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Label of bucket `i` of `n` in [`StrategyStats::match_blocks_histogram`]: `[0, 1, 2-3, 4-7,
/// ...]`, the last one open-ended.
pub fn bucket_label(i: usize, n: usize) -> String {
    if i == 0 {
        return "0".into();
    }
    let lo = 1u64.checked_shl((i - 1) as u32).unwrap_or(u64::MAX);
    if i + 1 == n {
        return format!("{lo}+");
    }
    let hi = lo.saturating_mul(2) - 1;
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

impl Learned {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "index_blocks",
            "Blocks the strategy's prefix index tracks now",
            m.index_blocks.clone(),
        );
        registry.register(
            "index_budget_blocks",
            "Most blocks the strategy's prefix index may track (the fleet-wide budget)",
            m.index_budget_blocks.clone(),
        );
        registry.register(
            "index_bytes",
            "Memory the strategy's prefix index holds, in bytes",
            m.index_bytes.clone(),
        );
        registry.register(
            "predicted_cached_tokens",
            "Cached prompt tokens the strategy predicted, over requests whose engine reported usage",
            m.predicted.clone(),
        );
        registry.register(
            "reported_cached_tokens",
            "Cached prompt tokens the engines reported (usage.prompt_tokens_details.cached_tokens) for the same requests",
            m.reported.clone(),
        );
        registry.register(
            "cache_prediction_ratio",
            "Reported / predicted cached tokens: near 1 the index agrees with the engines, far below 1 it predicts hits they do not have (absent until something was predicted)",
            m.ratio.clone(),
        );
        registry.register(
            "match_blocks",
            "Routing decisions by the cached prefix the chosen instance was predicted to hold, in chain blocks; label blocks is a range: 0, 1, 2-3, 4-7, ..., N+ (not cumulative)",
            m.match_blocks.clone(),
        );
        m
    }

    /// Replaces every series with the figures of `strategy` (none when it has no learned state).
    pub fn refresh(&self, strategy: &dyn Strategy) {
        self.index_blocks.clear();
        self.index_budget_blocks.clear();
        self.index_bytes.clear();
        self.predicted.clear();
        self.reported.clear();
        self.ratio.clear();
        self.match_blocks.clear();
        if let Some(stats) = strategy.stats() {
            self.set(strategy.name(), &stats);
        }
    }

    fn set(&self, name: &'static str, s: &StrategyStats) {
        let l = StrategyLabels { strategy: name };
        self.index_blocks
            .get_or_create(&l)
            .set(gauge(s.index_blocks));
        self.index_budget_blocks
            .get_or_create(&l)
            .set(gauge(s.index_budget_blocks));
        self.index_bytes.get_or_create(&l).set(gauge(s.index_bytes));
        self.predicted
            .get_or_create(&l)
            .set(s.predicted_cached_tokens);
        self.reported
            .get_or_create(&l)
            .set(s.reported_cached_tokens);
        if let Some(ratio) = s.prediction_ratio() {
            self.ratio.get_or_create(&l).set(ratio);
        }
        let n = s.match_blocks_histogram.len();
        for (i, &count) in s.match_blocks_histogram.iter().enumerate() {
            self.match_blocks
                .get_or_create(&MatchLabels {
                    strategy: name,
                    blocks: bucket_label(i, n),
                })
                .set(count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_labels() {
        let labels: Vec<String> = (0..6).map(|i| bucket_label(i, 6)).collect();
        assert_eq!(labels, ["0", "1", "2-3", "4-7", "8-15", "16+"]);
        assert_eq!(bucket_label(13, 14), "4096+");
    }

    #[test]
    fn exports_only_what_the_strategy_has() {
        use prefix_router_core::{StrategyConfig, StrategyKind};
        let mut registry = Registry::with_prefix("prefix_router");
        let learned = Learned::register(&mut registry);
        let render = |registry: &Registry| {
            let mut out = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut out, registry);
            out
        };
        let kind = |n: &str| StrategyKind::named(n).unwrap_or_else(|| panic!("{n}"));
        let plain = StrategyConfig::new(kind("prefix-aware"))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        learned.refresh(plain.as_ref());
        assert!(!render(&registry).contains("prefix_router_index_blocks{"));
        let cache = StrategyConfig::new(kind("cache-aware"))
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        learned.refresh(cache.as_ref());
        let text = render(&registry);
        for want in [
            "prefix_router_index_blocks{strategy=\"cache-aware\"} 0",
            "prefix_router_index_budget_blocks{strategy=\"cache-aware\"} 1048576",
            "prefix_router_predicted_cached_tokens_total{strategy=\"cache-aware\"} 0",
            "prefix_router_reported_cached_tokens_total{strategy=\"cache-aware\"} 0",
            "prefix_router_match_blocks_total{strategy=\"cache-aware\",blocks=\"2-3\"} 0",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
        assert!(!text.contains("prefix_router_cache_prediction_ratio{"));
        learned.refresh(plain.as_ref());
        assert!(!render(&registry).contains("strategy=\"cache-aware\""));
    }
}
