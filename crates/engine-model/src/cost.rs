//! Step time model: prefill grows with uncached tokens and context, decode with the batch.
//!
//! One engine step runs one forward pass over every token scheduled in it (prefill chunks and one
//! token per decoding sequence). Its duration is
//!
//! ```text
//! step = step_overhead_s
//!      + per_seq_s            * seqs                   (per-sequence CPU work: sampling, detokenize)
//!      + max(weight_read_s,                            (dense layers: memory-bound floor ...
//!            linear_s_per_token * tokens)              ... or compute-bound, whichever is larger)
//!      + attention_s_per_pair * prefill_pairs          (prefill attention compute)
//!      + kv_read_s_per_token  * decode_context_tokens  (decode attention: reading the batch's KV)
//! ```
//!
//! - `tokens` = prefill tokens + decoding sequences (each decode is one token through the GEMMs).
//! - `prefill_pairs` = (query token, context token) pairs of the prefill chunks: a chunk of `n`
//!   tokens starting after `p` tokens already in context attends to `n·p + n(n+1)/2` positions
//!   (causal), so cached context still costs attention, and long prompts cost more per token.
//! - `decode_context_tokens` = sum of the context lengths of the decoding sequences (their KV is
//!   read once per step).
//!
//! The `max` is a roofline: a step reads the weights once, and small batches cannot go faster than
//! that (decode is memory-bound), while a large prefill chunk is compute-bound and hides the
//! weight read. Attention terms are added because they scale with context, not with weights.
//! Presets derive each coefficient from model and GPU figures (see `presets`).

/// Coefficients of the step time model (seconds).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CostModel {
    /// Fixed cost of any step (scheduling, sampling, kernel launches).
    pub step_overhead_s: f64,
    /// CPU cost per scheduled sequence per step (scheduler bookkeeping, sampling, detokenizing).
    pub per_seq_s: f64,
    /// Time to stream the weights from HBM once: the floor of every step.
    pub weight_read_s: f64,
    /// Dense-layer compute per token in the step (about 2 × parameters FLOPs).
    pub linear_s_per_token: f64,
    /// Prefill attention compute per (query token, context token) pair.
    pub attention_s_per_pair: f64,
    /// Decode attention: time to read one token's KV (all layers) per step.
    pub kv_read_s_per_token: f64,
    /// Latency a request spends before the scheduler sees it (HTTP, chat template, tokenization,
    /// first-token delivery): the engine queues it only this long after `submit`.
    pub request_overhead_s: f64,
}

/// What one step computes: the inputs of [`CostModel::step_time`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepWork {
    /// Prompt tokens prefilled in this step (all chunks together).
    pub prefill_tokens: u64,
    /// Causal (query, context) pairs of those chunks.
    pub prefill_pairs: u64,
    /// Sequences decoding one token in this step.
    pub decode_seqs: u64,
    /// Sum of the decoding sequences' context lengths (KV tokens read).
    pub decode_context_tokens: u64,
    /// Sequences scheduled in this step (prefilling or decoding).
    pub seqs: u64,
}

impl StepWork {
    /// Adds a prefill chunk of `n` tokens that starts after `past` tokens of context.
    pub fn add_prefill(&mut self, past: u64, n: u64) {
        self.prefill_tokens += n;
        self.prefill_pairs += n * past + n * (n + 1) / 2;
        self.seqs += 1;
    }

    /// Adds one decoding sequence whose context holds `context` tokens.
    pub fn add_decode(&mut self, context: u64) {
        self.decode_seqs += 1;
        self.decode_context_tokens += context;
        self.seqs += 1;
    }
}

impl CostModel {
    /// Duration of a step doing `work` (the formula in the module documentation).
    pub fn step_time(&self, work: &StepWork) -> f64 {
        let tokens = (work.prefill_tokens + work.decode_seqs) as f64;
        self.step_overhead_s
            + self.per_seq_s * work.seqs as f64
            + self.weight_read_s.max(self.linear_s_per_token * tokens)
            + self.attention_s_per_pair * work.prefill_pairs as f64
            + self.kv_read_s_per_token * work.decode_context_tokens as f64
    }

    /// Time to first token of a request alone on an idle engine, prefilled in chunks of at most
    /// `chunk` tokens (for summaries and calibration checks; includes `request_overhead_s`).
    pub fn idle_ttft(&self, prompt_tokens: u32, cached_tokens: u32, chunk: u32) -> f64 {
        let chunk = u64::from(chunk.max(1));
        let prompt = u64::from(prompt_tokens.max(1));
        let mut done = u64::from(cached_tokens).min(prompt - 1);
        let mut t = self.request_overhead_s;
        while done < prompt {
            let n = chunk.min(prompt - done);
            let mut w = StepWork::default();
            w.add_prefill(done, n);
            t += self.step_time(&w);
            done += n;
        }
        t
    }

    /// Duration of a decode-only step of `seqs` sequences with `context` tokens each.
    pub fn decode_step_time(&self, seqs: u32, context: u32) -> f64 {
        let mut w = StepWork::default();
        for _ in 0..seqs {
            w.add_decode(u64::from(context));
        }
        self.step_time(&w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        CostModel {
            step_overhead_s: 0.001,
            per_seq_s: 0.0,
            weight_read_s: 0.010,
            linear_s_per_token: 0.0001,
            attention_s_per_pair: 1e-9,
            kv_read_s_per_token: 1e-7,
            request_overhead_s: 0.0,
        }
    }

    #[test]
    fn small_steps_pay_the_weight_read_floor() {
        let m = model();
        let one = m.decode_step_time(1, 0);
        assert!((one - 0.011).abs() < 1e-12);
        // 50 decodes are still under the floor: only KV reads add.
        assert!((m.decode_step_time(50, 0) - 0.011).abs() < 1e-12);
        assert!(m.decode_step_time(50, 1000) > m.decode_step_time(10, 1000));
    }

    #[test]
    fn prefill_grows_with_tokens_and_context() {
        let m = model();
        let mut a = StepWork::default();
        a.add_prefill(0, 1000);
        let mut b = StepWork::default();
        b.add_prefill(5000, 1000);
        assert!(m.step_time(&b) > m.step_time(&a));
        assert_eq!(a.prefill_pairs, 1000 * 1001 / 2);
        assert!(m.idle_ttft(4000, 0, 1000) > m.idle_ttft(4000, 3000, 1000));
    }
}
