//! The engines' own view, scraped from each instance's Prometheus endpoint: prefix-cache hit
//! ratio, running and waiting requests, KV-cache usage (vLLM, SGLang and llama.cpp metric
//! names). The router's in-flight counts only see its own traffic; an engine's queue holds
//! everyone's. With `route_on_queues`, what an engine holds beyond this router's own in flight
//! (other router replicas' requests, or direct clients') is stored on the instance for routing
//! ([`Instance::report_engine_queue`]), trusted for `stale_after` from when the scrape was sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use prefix_router_core::{Instance, InstanceState};

use crate::metrics::InstanceLabels;
use crate::prom;
use crate::state::AppState;

/// Largest metrics page read from one instance.
const MAX_PAGE: usize = 4 * 1024 * 1024;

/// Cumulative prefix-cache counters (vLLM V1 counts tokens).
const HITS: &[&str] = &["vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"];
const QUERIES: &[&str] = &[
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_queries",
];
/// Hit-rate gauges of engines that export a ratio instead of counters.
const HIT_RATE: &[&str] = &["vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"];
const RUNNING: &[&str] = &[
    "vllm:num_requests_running",
    "sglang:num_running_reqs",
    "llamacpp:requests_processing",
];
const WAITING: &[&str] = &[
    "vllm:num_requests_waiting",
    "sglang:num_queue_reqs",
    "llamacpp:requests_deferred",
];
const KV_USAGE: &[&str] = &[
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "sglang:token_usage",
];

/// The first of `names` the page has: its samples' sum over their label sets (counts add up
/// across an engine's cores or models).
fn first(samples: &Totals, names: &[&str]) -> Option<f64> {
    names
        .iter()
        .find_map(|n| samples.get(*n).map(|&(sum, _)| sum))
}

/// The same for a ratio: its samples' mean (summed, a data-parallel engine's two cores at 0.8
/// and 0.7 of their KV cache read 1.5, where the gauge is 0 to 1).
fn first_mean(samples: &Totals, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| {
        samples
            .get(*n)
            .filter(|&&(_, count)| count > 0)
            .map(|&(sum, count)| sum / f64::from(count))
    })
}

type Totals = HashMap<String, (f64, u32)>;

/// Counters seen at the previous scrape of an instance, and the ratio derived then.
#[derive(Debug, Clone, Copy)]
struct Seen {
    hits: f64,
    queries: f64,
    ratio: Option<f64>,
}

/// What the previous scrape saw, per instance, to turn counters into a ratio per interval.
#[derive(Debug, Default)]
pub struct Previous {
    counters: Mutex<HashMap<String, Seen>>,
}

async fn scrape(state: &AppState, inst: &Instance, path: &str) -> Option<Totals> {
    let (status, page) = crate::upstream::get(
        &state.client,
        &inst.spec().url,
        path,
        MAX_PAGE,
        state.settings.health.timeout,
    )
    .await?;
    status
        .is_success()
        .then(|| prom::totals(&String::from_utf8_lossy(&page)))
}

/// One round: scrapes every instance that is not ejected, replaces the engine gauges and, with
/// `route_on_queues`, the queues routing reads.
pub async fn scrape_once(state: &AppState, path: &str, previous: &Previous) {
    let settings = &state.settings.engine_metrics;
    // From when the scrape is sent: a slow answer is as old as the question.
    let valid_until = state.now_s() + settings.stale_after.as_secs_f64();
    let snapshot = state.fleet.snapshot();
    let targets: Vec<&Arc<Instance>> = snapshot
        .instances()
        .iter()
        .filter(|i| i.state() != InstanceState::Ejected)
        .collect();
    let pages =
        futures_util::future::join_all(targets.iter().map(|i| scrape(state, i, path))).await;
    let m = &state.metrics;
    // Not while /metrics encodes: it would find these series cleared and half refilled.
    let _one_scrape = m.scrape.lock().unwrap_or_else(|p| p.into_inner());
    m.engine_hit_ratio.clear();
    m.engine_running.clear();
    m.engine_waiting.clear();
    m.engine_kv_usage.clear();
    m.engine_others.clear();
    let mut prev = previous.counters.lock().unwrap_or_else(|p| p.into_inner());
    for (inst, page) in targets.iter().zip(pages) {
        let Some(samples) = page else { continue };
        let id = inst.id().to_string();
        let labels = InstanceLabels {
            instance: crate::metrics::IdLabel(Arc::clone(&inst.id().0)),
        };
        let counters = first(&samples, HITS).zip(first(&samples, QUERIES));
        let ratio = match (counters, prev.get(&id)) {
            // Hits over queries since the last scrape: the ratio now, not since the engine
            // started. Without new queries the last ratio stands.
            (Some((h, q)), Some(p)) if q > p.queries && h >= p.hits => {
                Some((h - p.hits) / (q - p.queries))
            }
            (Some((h, q)), Some(p)) if q == p.queries && h == p.hits => p.ratio,
            _ => first_mean(&samples, HIT_RATE),
        };
        if let Some((hits, queries)) = counters {
            prev.insert(
                id,
                Seen {
                    hits,
                    queries,
                    ratio,
                },
            );
        }
        if let Some(r) = ratio {
            m.engine_hit_ratio.get_or_create(&labels).set(r);
        }
        let running = first(&samples, RUNNING);
        let waiting = first(&samples, WAITING);
        if let Some(v) = running {
            m.engine_running.get_or_create(&labels).set(v);
        }
        if let Some(v) = waiting {
            m.engine_waiting.get_or_create(&labels).set(v);
        }
        // Both, or the queue is unknown: an engine that exports only one of them does not
        // say how many requests it holds.
        if let (true, Some(r), Some(w)) = (settings.route_on_queues, running, waiting) {
            let others = inst.report_engine_queue(r, w, valid_until);
            m.engine_others
                .get_or_create(&labels)
                .set(f64::from(others.total()));
        }
        if let Some(v) = first_mean(&samples, KV_USAGE) {
            m.engine_kv_usage.get_or_create(&labels).set(v);
        }
    }
    prev.retain(|id, _| snapshot.get(id).is_some());
}

/// Scrapes every `interval` until aborted.
pub async fn run(state: Arc<AppState>, interval: std::time::Duration, path: String) {
    let previous = Previous::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        scrape_once(&state, &path, &previous).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data-parallel vLLM labels each engine core's gauges apart: counts add up, a ratio is
    /// their mean (summed, two cores at 0.8 and 0.7 of their KV cache read 1.5).
    #[test]
    fn counts_add_up_across_engine_cores_and_ratios_average() {
        let page = "vllm:num_requests_running{engine=\"0\"} 3\n\
                    vllm:num_requests_running{engine=\"1\"} 2\n\
                    vllm:kv_cache_usage_perc{engine=\"0\"} 0.8\n\
                    vllm:kv_cache_usage_perc{engine=\"1\"} 0.7\n\
                    sglang:cache_hit_rate 0.25\n";
        let t = prom::totals(page);
        assert_eq!(first(&t, RUNNING), Some(5.0));
        let usage = first_mean(&t, KV_USAGE).unwrap_or(f64::NAN);
        assert!((usage - 0.75).abs() < 1e-12, "{usage}");
        assert_eq!(first_mean(&t, HIT_RATE), Some(0.25));
        assert_eq!(first_mean(&t, WAITING), None);
    }
}
