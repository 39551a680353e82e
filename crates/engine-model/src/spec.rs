//! Model and hardware figures, and the derivations that turn them into engine parameters.
//!
//! Presets state raw, citable figures (layer counts, GPU peak FLOP/s, HBM bandwidth) plus a few
//! efficiency assumptions; everything else (KV bytes per token, KV capacity, cost coefficients)
//! is computed here, so a reader can check each number from its inputs.

use crate::CostModel;

/// Bytes in one GiB.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Shape of a decoder-only transformer, as in its Hugging Face `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Total parameters.
    pub params: f64,
    /// `num_hidden_layers`.
    pub layers: u32,
    /// `num_attention_heads` (query heads).
    pub heads: u32,
    /// `num_key_value_heads` (grouped-query attention).
    pub kv_heads: u32,
    /// `hidden_size / num_attention_heads`.
    pub head_dim: u32,
    /// Bytes per weight (2 for bf16).
    pub weight_bytes_per_param: f64,
    /// Bytes per KV element (2 for a bf16 KV cache).
    pub kv_bytes_per_elem: f64,
}

impl ModelSpec {
    /// KV bytes per token: K and V, every layer, every KV head.
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * f64::from(self.layers)
            * f64::from(self.kv_heads)
            * f64::from(self.head_dim)
            * self.kv_bytes_per_elem
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> f64 {
        self.params * self.weight_bytes_per_param
    }

    /// Dense-layer FLOPs per token: one multiply-add per parameter.
    pub fn linear_flops_per_token(&self) -> f64 {
        2.0 * self.params
    }

    /// Attention FLOPs per (query, context) pair: Q·Kᵀ and P·V, 2 FLOPs per element each, over
    /// every query head and layer.
    pub fn attention_flops_per_pair(&self) -> f64 {
        4.0 * f64::from(self.layers) * f64::from(self.heads) * f64::from(self.head_dim)
    }
}

/// One accelerator's datasheet figures.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSpec {
    /// Device memory the driver reports, bytes.
    pub memory_bytes: f64,
    /// Dense bf16 tensor-core peak, FLOP/s.
    pub bf16_flops: f64,
    /// HBM bandwidth, bytes/s.
    pub hbm_bytes_per_s: f64,
}

/// A model served on `gpus` accelerators (tensor parallel), with efficiency assumptions.
#[derive(Debug, Clone, PartialEq)]
pub struct Deployment {
    /// The model.
    pub model: ModelSpec,
    /// The accelerator.
    pub gpu: GpuSpec,
    /// Tensor-parallel degree.
    pub gpus: u32,
    /// vLLM `gpu_memory_utilization`: share of device memory the engine may use.
    pub gpu_memory_utilization: f64,
    /// Memory per GPU the engine uses besides weights and KV (activations, CUDA graphs, NCCL
    /// buffers, allocator slack), bytes.
    pub reserved_bytes_per_gpu: f64,
    /// Share of peak bf16 FLOP/s reached by prefill (GEMMs, attention, TP communication).
    pub compute_efficiency: f64,
    /// Share of peak HBM bandwidth reached by decode (weight and KV reads).
    pub bandwidth_efficiency: f64,
    /// Fixed cost per step, seconds.
    pub step_overhead_s: f64,
    /// CPU cost per scheduled sequence per step, seconds.
    pub per_seq_s: f64,
    /// Frontend latency per request, seconds.
    pub request_overhead_s: f64,
}

impl Deployment {
    /// Bytes left for the KV cache over all GPUs.
    pub fn kv_bytes(&self) -> f64 {
        let per_gpu = self.gpu.memory_bytes * self.gpu_memory_utilization
            - self.model.weight_bytes() / f64::from(self.gpus)
            - self.reserved_bytes_per_gpu;
        (per_gpu * f64::from(self.gpus)).max(0.0)
    }

    /// KV cache capacity in tokens.
    pub fn kv_capacity_tokens(&self) -> u64 {
        (self.kv_bytes() / self.model.kv_bytes_per_token()) as u64
    }

    /// KV cache capacity in whole blocks of `block_tokens`.
    pub fn kv_capacity_blocks(&self, block_tokens: u32) -> u32 {
        let blocks = self.kv_capacity_tokens() / u64::from(block_tokens.max(1));
        u32::try_from(blocks).unwrap_or(u32::MAX)
    }

    /// Sustained FLOP/s of the whole deployment.
    pub fn flops(&self) -> f64 {
        self.gpu.bf16_flops * f64::from(self.gpus) * self.compute_efficiency
    }

    /// Sustained HBM bytes/s of the whole deployment.
    pub fn bandwidth(&self) -> f64 {
        self.gpu.hbm_bytes_per_s * f64::from(self.gpus) * self.bandwidth_efficiency
    }

    /// The step time model (formula in `cost`).
    pub fn cost_model(&self) -> CostModel {
        CostModel {
            step_overhead_s: self.step_overhead_s,
            per_seq_s: self.per_seq_s,
            weight_read_s: self.model.weight_bytes() / self.bandwidth(),
            linear_s_per_token: self.model.linear_flops_per_token() / self.flops(),
            attention_s_per_pair: self.model.attention_flops_per_pair() / self.flops(),
            kv_read_s_per_token: self.model.kv_bytes_per_token() / self.bandwidth(),
            request_overhead_s: self.request_overhead_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_per_token_of_llama_70b() {
        let m = ModelSpec {
            params: 70.6e9,
            layers: 80,
            heads: 64,
            kv_heads: 8,
            head_dim: 128,
            weight_bytes_per_param: 2.0,
            kv_bytes_per_elem: 2.0,
        };
        assert_eq!(m.kv_bytes_per_token(), 327_680.0);
    }
}
