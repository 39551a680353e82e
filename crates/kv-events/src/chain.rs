//! The router's own names for token blocks: block `k` of a prompt is the hash of its
//! `block_size` token ids, seeded with the name of block `k - 1`, so a name stands for the
//! whole prefix up to its end. Computed from a request's token ids (as the router tokenizes
//! it) and from the token ids a `BlockStored` event carries (the engine's), so the two meet
//! without ever reproducing an engine's own block hash.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The "block before the first".
pub const ROOT: u64 = 0x7072_6678_746f_6b30; // "prfxtok0"

/// What names a LoRA adapter's blocks apart from the base model's: an engine keys a block by its
/// adapter too, so block `k` of a prompt run under adapter `name` is named as the base model's
/// block of the same tokens, XOR this (never 0, which is the base model). A request names the
/// adapter in its `model`; a `BlockStored` event in its `lora_name`.
pub fn adapter_mix(name: &str) -> u64 {
    xxh3_64_with_seed(name.as_bytes(), ADAPTER_SEED) | 1
}

/// Seed of [`adapter_mix`] (any fixed value: every router must agree on it).
const ADAPTER_SEED: u64 = 0x6c6f_7261_5f6d_6978; // "lora_mix"

/// The name of a block of `tokens` after the block named `prev`.
pub fn token_block(prev: u64, tokens: &[u32]) -> u64 {
    let mut bytes = Vec::with_capacity(tokens.len() * 4);
    for t in tokens {
        bytes.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, prev)
}

/// The names of the full blocks of `ids`, `block_size` tokens each (a partial last block is
/// not cached by an engine, so it has no name).
pub fn token_chain(ids: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut prev = ROOT;
    ids.chunks_exact(block_size)
        .map(|b| {
            prev = token_block(prev, b);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_covers_its_prefix() {
        let a = token_chain(&[1, 2, 3, 4, 5], 2);
        assert_eq!(a.len(), 2, "the partial block has no name");
        assert_eq!(a[0], token_block(ROOT, &[1, 2]));
        assert_eq!(a[1], token_block(a[0], &[3, 4]));
        let b = token_chain(&[9, 2, 3, 4], 2);
        assert_ne!(a[1], b[1], "same tokens after a different prefix");
        assert!(token_chain(&[1], 0).is_empty());
    }
}
