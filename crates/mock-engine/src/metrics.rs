//! `GET /metrics`: Prometheus text with vLLM's metric names and meanings.
//!
//! - `vllm:num_requests_running` / `vllm:num_requests_waiting`: requests in the batch / queued.
//! - `vllm:kv_cache_usage_perc`: share (0..1) of KV blocks held by running requests; cached
//!   blocks nobody uses count as free, as in vLLM V1 (they are reclaimable).
//! - `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`: prompt tokens looked up
//!   in the prefix cache / found there (their ratio is the hit rate); the hits equal the sum of
//!   the `cached_tokens` reported in responses.
//! - `vllm:prompt_tokens_total` / `vllm:generation_tokens_total`: prompt tokens admitted, output
//!   tokens produced.
//! - `mock:prefix_cache_digest` (with KV events on): names the set of cached blocks, as
//!   `prefix_router_kv_events::block_digest` does for a subscriber's view.
//! - `mock:prefix_cache_blocks`: blocks the prefix cache holds (the mock's own: what its KV
//!   events add up to, for tests of a subscriber).
//! - `vllm:time_to_first_token_seconds`: histogram of engine-time TTFT (submission to first
//!   token, queueing included): what a real engine of the preset would report, not the scaled
//!   wall time the mock took.

use std::fmt::Write;

use prefix_router_engine_model::EngineStats;

/// Upper bounds of the TTFT histogram, seconds (vLLM's buckets for this metric).
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// What `/metrics` shows, updated by the engine task.
#[derive(Debug)]
pub(crate) struct Metrics {
    model: String,
    capacity_blocks: u32,
    stats: EngineStats,
    ttft_counts: [u64; TTFT_BUCKETS.len()],
    ttft_sum: f64,
    ttft_count: u64,
    kv_digest: Option<u64>,
}

impl Metrics {
    /// Empty metrics for an engine serving `model` with `capacity_blocks` KV blocks.
    pub fn new(model: &str, capacity_blocks: u32) -> Self {
        Metrics {
            model: model.to_owned(),
            capacity_blocks: capacity_blocks.max(1),
            stats: EngineStats::default(),
            ttft_counts: [0; TTFT_BUCKETS.len()],
            ttft_sum: 0.0,
            ttft_count: 0,
            kv_digest: None,
        }
    }

    /// Records one time to first token, engine seconds.
    pub fn observe_ttft(&mut self, seconds: f64) {
        let s = if seconds.is_finite() {
            seconds.max(0.0)
        } else {
            0.0
        };
        if let Some(i) = TTFT_BUCKETS.iter().position(|&b| s <= b) {
            self.ttft_counts[i] += 1;
        }
        self.ttft_sum += s;
        self.ttft_count += 1;
    }

    /// Replaces the engine counters.
    pub fn set_stats(&mut self, stats: EngineStats) {
        self.stats = stats;
    }

    /// Sets the digest of the cache's blocks (only an engine that publishes KV events has one).
    pub fn set_kv_digest(&mut self, digest: u64) {
        self.kv_digest = Some(digest);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let label = format!("model_name=\"{}\"", escape_label(&self.model));
        let s = &self.stats;
        let usage = (f64::from(s.used_blocks) / f64::from(self.capacity_blocks)).clamp(0.0, 1.0);
        let gauges: [(&str, &str, f64); 4] = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                f64::from(s.running),
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                f64::from(s.waiting),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                usage,
            ),
            (
                "mock:prefix_cache_blocks",
                "Blocks the prefix cache holds now (what its KV events add up to; not a vLLM metric).",
                f64::from(s.cached_blocks),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{label}}} {v}"
            );
        }
        if let Some(d) = self.kv_digest {
            // 52 bits: an f64 holds them exactly.
            let name = "mock:prefix_cache_digest";
            let _ = writeln!(
                out,
                "# HELP {name} XOR of a mix of every cached block's hash as its KV events name it: \
                 a subscriber's view that lists the same blocks has the same digest.\n\
                 # TYPE {name} gauge\n{name}{{{label}}} {d}"
            );
        }
        let counters: [(&str, &str, u64); 4] = [
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                s.prompt_tokens,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                s.cached_tokens,
            ),
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                s.prompt_tokens,
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                s.generation_tokens,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{label}}} {v}"
            );
        }
        let name = "vllm:time_to_first_token_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Histogram of time to first token in seconds (engine time).\n\
             # TYPE {name} histogram"
        );
        let mut cumulative = 0u64;
        for (b, c) in TTFT_BUCKETS.iter().zip(self.ttft_counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{label},le=\"{b}\"}} {cumulative}");
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{label},le=\"+Inf\"}} {}",
            self.ttft_count
        );
        let _ = writeln!(out, "{name}_sum{{{label}}} {}", self.ttft_sum);
        let _ = writeln!(out, "{name}_count{{{label}}} {}", self.ttft_count);
        out
    }
}

/// Escapes a Prometheus label value.
fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_with_the_model_label() {
        let mut m = Metrics::new("m\"x", 100);
        m.set_stats(EngineStats {
            prompt_tokens: 200,
            cached_tokens: 96,
            used_blocks: 25,
            running: 2,
            ..EngineStats::default()
        });
        m.observe_ttft(0.03);
        m.observe_ttft(5000.0);
        let t = m.render();
        assert!(
            t.contains("vllm:prefix_cache_hits_total{model_name=\"m\\\"x\"} 96\n"),
            "{t}"
        );
        assert!(t.contains("vllm:prefix_cache_queries_total{model_name=\"m\\\"x\"} 200\n"));
        assert!(t.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.25\n"));
        assert!(t.contains("vllm:num_requests_running{model_name=\"m\\\"x\"} 2\n"));
        assert!(t.contains("le=\"0.04\"} 1\n"));
        assert!(t.contains("le=\"2560\"} 1\n"));
        assert!(t.contains("le=\"+Inf\"} 2\n"));
        assert!(t.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\"} 2\n"));
    }
}
