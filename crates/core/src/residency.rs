//! What the engines say they hold, where the router knows it exactly: an engine that publishes
//! its KV-cache events (vLLM) lets the router name every block it caches by the block's
//! tokens. A strategy that routes on it ([`Strategy::reads_tokens`](crate::Strategy)) gets,
//! with each request, the names of its token blocks and a [`Residency`] to ask; core stays pure
//! (the server answers from its event views, the simulator from its engine models).

use crate::Instance;

/// What an engine's report says about one request's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Leading blocks of the request's chain the instance holds on its GPU.
    pub matched_blocks: u32,
    /// Blocks after those that it can load from an offloaded copy (CPU memory or further)
    /// instead of computing them: cheaper than a miss, dearer than a hit.
    pub offloaded_blocks: u32,
}

/// How many leading token blocks of a request an instance holds.
pub trait Residency: Send + Sync {
    /// What `instance` reports about `chain`, run under the LoRA adapter of `adapter` (see
    /// [`TokenRoute::adapter`]), in one look at its view; `None` where that is not known
    /// exactly (no view of it, or one that missed events): the strategy then infers.
    fn report(&self, instance: &Instance, chain: &[u64], adapter: u64) -> Option<Report>;
}

/// A request's token blocks and whom to ask about them.
#[derive(Clone, Copy)]
pub struct TokenRoute<'a> {
    /// The names of its full token blocks, in order.
    pub chain: &'a [u64],
    /// Tokens per block.
    pub block_tokens: u32,
    /// Tokens in the whole prompt.
    pub prompt_tokens: u32,
    /// The LoRA adapter the request names, as its blocks' names are mixed with it (an engine
    /// keys an adapter's blocks apart from the base model's); 0 for the base model, or a
    /// `model` no engine has announced an adapter's blocks under.
    pub adapter: u64,
    /// Who knows what each instance holds.
    pub residency: &'a dyn Residency,
}

impl TokenRoute<'_> {
    /// The prompt units (characters) that `blocks` matched token blocks cover, scaled by the
    /// prompt's own units per token, at most `prompt_units`.
    pub fn units(&self, blocks: u32, prompt_units: u32) -> u32 {
        let tokens = u64::from(blocks) * u64::from(self.block_tokens);
        let units = tokens * u64::from(prompt_units) / u64::from(self.prompt_tokens.max(1));
        units.min(u64::from(prompt_units)) as u32
    }
}

impl std::fmt::Debug for TokenRoute<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenRoute")
            .field("blocks", &self.chain.len())
            .field("block_tokens", &self.block_tokens)
            .field("prompt_tokens", &self.prompt_tokens)
            .finish()
    }
}

impl PartialEq for TokenRoute<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.chain == other.chain
            && self.block_tokens == other.block_tokens
            && self.prompt_tokens == other.prompt_tokens
            && std::ptr::addr_eq(self.residency, other.residency)
    }
}
