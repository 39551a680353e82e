//! What the router recorded in its access log, summarized the way the simulator reports: the
//! figures a sweep's "current setting" should reproduce if the engine model fits the fleet.

use std::collections::BTreeMap;

use prefix_router_sim::stats::LatencySummary;
use prefix_router_workload::trace::AccessRecord;

/// The access log's own figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Observed {
    /// Lines (requests the router dispatched).
    pub requests: u64,
    /// Of those, answered with a 2xx status.
    pub ok: u64,
    /// Prompt tokens the engines reported, over lines that report usage.
    pub prompt_tokens: u64,
    /// Of those, served from the engines' prefix caches.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens` (`None` when no line reports usage).
    pub hit_rate: Option<f64>,
    /// Time to first token as the router measured it, over lines that have one (ms).
    pub ttft_ms: Option<LatencySummary>,
    /// Share of lines per instance, largest first.
    pub instance_share: Vec<(String, f64)>,
    /// Lines per decision reason.
    pub reasons: BTreeMap<String, u64>,
}

impl Observed {
    /// Summarizes access-log lines.
    pub fn from_records(records: &[AccessRecord]) -> Self {
        let requests = records.len() as u64;
        let ok = records
            .iter()
            .filter(|r| r.status.is_some_and(|s| (200..300).contains(&s)))
            .count() as u64;
        let (mut prompt_tokens, mut cached_tokens) = (0u64, 0u64);
        for r in records {
            if let (Some(p), Some(c)) = (r.prompt_tokens, r.cached_tokens) {
                prompt_tokens += u64::from(p);
                cached_tokens += u64::from(c.min(p));
            }
        }
        let mut ttft: Vec<f64> = records
            .iter()
            .filter_map(|r| r.ttft_s)
            .filter(|t| t.is_finite() && *t >= 0.0)
            .map(|t| t * 1000.0)
            .collect();
        ttft.sort_by(f64::total_cmp);
        let mut per_instance: BTreeMap<&str, u64> = BTreeMap::new();
        let mut reasons = BTreeMap::new();
        for r in records {
            *per_instance
                .entry(r.instance.as_deref().unwrap_or("unknown"))
                .or_insert(0) += 1;
            *reasons
                .entry(r.reason.clone().unwrap_or_else(|| "unknown".into()))
                .or_insert(0) += 1;
        }
        let mut instance_share: Vec<(String, f64)> = per_instance
            .into_iter()
            .map(|(id, n)| (id.to_string(), n as f64 / requests.max(1) as f64))
            .collect();
        instance_share.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Observed {
            requests,
            ok,
            prompt_tokens,
            cached_tokens,
            hit_rate: (prompt_tokens > 0).then(|| cached_tokens as f64 / prompt_tokens as f64),
            ttft_ms: (!ttft.is_empty()).then(|| LatencySummary::from_sorted(&ttft)),
            instance_share,
            reasons,
        }
    }
}
