//! An engine's limits and costs, checked before it runs.

use crate::CostModel;

/// Limits and costs of one engine.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EngineConfig {
    /// Tokens per KV block (16 in vLLM).
    pub block_tokens: u32,
    /// KV cache capacity in blocks (shared by running requests and the prefix cache).
    pub kv_capacity_blocks: u32,
    /// Most sequences running at once (vLLM `max_num_seqs`).
    pub max_num_seqs: u32,
    /// Token budget per step (vLLM `max_num_batched_tokens`, chunked prefill).
    pub max_batched_tokens: u32,
    /// Step time model.
    pub cost: CostModel,
}

/// Why an [`EngineConfig`] cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A count that must be positive is zero.
    #[error("engine config: `{field}` must be at least 1")]
    Zero {
        /// Field name.
        field: &'static str,
    },
    /// The token budget cannot give every running sequence its decode token.
    #[error(
        "engine config: `max_batched_tokens` ({budget}) must be at least `max_num_seqs` ({seqs}) \
         so every running sequence can decode each step"
    )]
    BudgetBelowSeqs {
        /// `max_batched_tokens`.
        budget: u32,
        /// `max_num_seqs`.
        seqs: u32,
    },
    /// A cost coefficient is negative, infinite or NaN.
    #[error("engine config: `cost.{field}` must be finite and non-negative, got {value}")]
    BadCost {
        /// Field name inside `cost`.
        field: &'static str,
        /// The offending value.
        value: f64,
    },
}

impl EngineConfig {
    /// Checks that an engine with this configuration can make progress.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("block_tokens", self.block_tokens),
            ("kv_capacity_blocks", self.kv_capacity_blocks),
            ("max_num_seqs", self.max_num_seqs),
            ("max_batched_tokens", self.max_batched_tokens),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        if self.max_batched_tokens < self.max_num_seqs {
            return Err(ConfigError::BudgetBelowSeqs {
                budget: self.max_batched_tokens,
                seqs: self.max_num_seqs,
            });
        }
        for (field, value) in self.cost_fields() {
            if !value.is_finite() || value < 0.0 {
                return Err(ConfigError::BadCost { field, value });
            }
        }
        Ok(())
    }

    /// KV cache capacity in tokens.
    pub fn kv_capacity_tokens(&self) -> u64 {
        u64::from(self.kv_capacity_blocks) * u64::from(self.block_tokens)
    }

    /// One human-readable paragraph: capacity, limits and a few derived latencies.
    pub fn summary(&self) -> String {
        let c = &self.cost;
        format!(
            "KV cache {} tokens ({} blocks of {}), max_num_seqs {}, max_batched_tokens {}; \
             idle TTFT: 8k-token prompt uncached {:.0} ms, fully cached {:.0} ms; \
             decode step: 1 seq {:.1} ms, 64 seqs at 2k context {:.1} ms",
            self.kv_capacity_tokens(),
            self.kv_capacity_blocks,
            self.block_tokens,
            self.max_num_seqs,
            self.max_batched_tokens,
            1e3 * c.idle_ttft(8000, 0, self.max_batched_tokens),
            1e3 * c.idle_ttft(8000, 8000, self.max_batched_tokens),
            1e3 * c.decode_step_time(1, 1000),
            1e3 * c.decode_step_time(64, 2048),
        )
    }

    fn cost_fields(&self) -> [(&'static str, f64); 7] {
        let c = &self.cost;
        [
            ("step_overhead_s", c.step_overhead_s),
            ("per_seq_s", c.per_seq_s),
            ("weight_read_s", c.weight_read_s),
            ("linear_s_per_token", c.linear_s_per_token),
            ("attention_s_per_pair", c.attention_s_per_pair),
            ("kv_read_s_per_token", c.kv_read_s_per_token),
            ("request_overhead_s", c.request_overhead_s),
        ]
    }

    /// The nearest configuration that can run: zero counts become 1, the budget is raised to
    /// `max_num_seqs`, bad cost coefficients become 0.
    pub(super) fn repaired(mut self) -> Self {
        self.block_tokens = self.block_tokens.max(1);
        self.kv_capacity_blocks = self.kv_capacity_blocks.max(1);
        self.max_num_seqs = self.max_num_seqs.max(1);
        self.max_batched_tokens = self.max_batched_tokens.max(self.max_num_seqs);
        let c = &mut self.cost;
        for v in [
            &mut c.step_overhead_s,
            &mut c.per_seq_s,
            &mut c.weight_read_s,
            &mut c.linear_s_per_token,
            &mut c.attention_s_per_pair,
            &mut c.kv_read_s_per_token,
            &mut c.request_overhead_s,
        ] {
            if !v.is_finite() || *v < 0.0 {
                *v = 0.0;
            }
        }
        self
    }
}
