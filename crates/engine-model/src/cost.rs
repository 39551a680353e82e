//! Step time model: prefill grows with uncached tokens and context, decode with the batch.

/// Coefficients of the step time model (seconds).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CostModel {
    /// Fixed cost of any step (scheduling, sampling, kernel launches).
    pub step_overhead_s: f64,
}
