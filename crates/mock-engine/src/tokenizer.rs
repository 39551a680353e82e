//! The tokenizer stand-in: one token per whitespace-separated word.
//!
//! It matches the workload crate's text model (one rendered word is one token; roles add no
//! tokens), so equal text gives equal tokens and equal block hashes in every process. A word's
//! token id is xxh3-64 of its bytes ([`TOKEN_SEED`]); the hash of block `k` is xxh3-64 of the
//! little-endian token ids of its `block_tokens` tokens, seeded with the hash of block `k - 1`
//! ([`ROOT_HASH`] for the first), so a block hash names the whole prefix up to its end. Only full
//! blocks are hashed, as engines cache only full blocks.

use xxhash_rust::xxh3::xxh3_64_with_seed;

pub use prefix_router_tokenize::words::{token_id, TOKEN_SEED};

/// The "previous block" hash of the first block.
pub const ROOT_HASH: u64 = 0x6d6f_636b_726f_6f74; // "mockroot"

/// A prompt cut into tokens and hashed blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTokens {
    /// Tokens in the prompt.
    pub tokens: u32,
    /// Chained hash of each full block, in order.
    pub block_hashes: Vec<u64>,
    /// Hash of every token (full and partial blocks): seeds the generated words.
    pub digest: u64,
    /// The tokens of the full blocks, as the 32-bit ids the engine's KV events report (the low
    /// half of each token id: a vocabulary index is what vLLM sends).
    pub block_token_ids: Vec<u32>,
}

/// Tokenizes text piece by piece (message contents in order), as one prompt.
#[derive(Debug)]
pub struct Tokenizer {
    block_tokens: usize,
    /// Token ids of the block being filled, little-endian.
    block: Vec<u8>,
    prev: u64,
    tokens: u32,
    block_hashes: Vec<u64>,
    digest: u64,
    block_token_ids: Vec<u32>,
}

impl Tokenizer {
    /// An empty prompt with blocks of `block_tokens` tokens (at least 1).
    pub fn new(block_tokens: u32) -> Self {
        let block_tokens = block_tokens.max(1) as usize;
        Tokenizer {
            block_tokens,
            block: Vec::with_capacity(block_tokens * 8),
            prev: ROOT_HASH,
            tokens: 0,
            block_hashes: Vec::new(),
            digest: ROOT_HASH,
            block_token_ids: Vec::new(),
        }
    }

    /// Appends the words of `text`.
    pub fn push_text(&mut self, text: &str) {
        for word in text.split_whitespace() {
            self.push_token(token_id(word));
        }
    }

    /// Appends one token id.
    pub fn push_token(&mut self, id: u64) {
        self.tokens = self.tokens.saturating_add(1);
        self.digest = xxh3_64_with_seed(&id.to_le_bytes(), self.digest);
        self.block.extend_from_slice(&id.to_le_bytes());
        if self.block.len() == self.block_tokens * 8 {
            self.prev = xxh3_64_with_seed(&self.block, self.prev);
            self.block_hashes.push(self.prev);
            self.block_token_ids.extend(
                self.block
                    .chunks_exact(8)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            );
            self.block.clear();
        }
    }

    /// The prompt so far.
    pub fn finish(self) -> PromptTokens {
        PromptTokens {
            tokens: self.tokens,
            block_hashes: self.block_hashes,
            digest: self.digest,
            block_token_ids: self.block_token_ids,
        }
    }
}

/// Tokenizes `texts` (message contents, in order) as one prompt.
pub fn tokenize<'a>(texts: impl IntoIterator<Item = &'a str>, block_tokens: u32) -> PromptTokens {
    let mut t = Tokenizer::new(block_tokens);
    for text in texts {
        t.push_text(text);
    }
    t.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(n: usize, salt: &str) -> String {
        (0..n)
            .map(|i| format!("{salt}{i}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn one_token_per_word_and_only_full_blocks_hashed() {
        let p = tokenize([words(40, "w").as_str()], 16);
        assert_eq!(p.tokens, 40);
        assert_eq!(p.block_hashes.len(), 2);
        assert_eq!(tokenize([""], 16).tokens, 0);
    }

    #[test]
    fn whitespace_and_message_boundaries_do_not_matter() {
        let text = words(33, "x");
        let (a, b) = text.split_at(text.find("x20").unwrap());
        let split = tokenize([a, b], 16);
        let spaced = tokenize([text.replace(' ', "\n  \t").as_str()], 16);
        let whole = tokenize([text.as_str()], 16);
        assert_eq!(split, whole);
        assert_eq!(spaced, whole);
    }

    #[test]
    fn blocks_chain_over_the_prefix() {
        let a = tokenize([words(16, "a").as_str(), words(16, "b").as_str()], 16);
        // Same second-block words after a different first block: a different second hash.
        let m = tokenize([words(16, "z").as_str(), words(16, "b").as_str()], 16);
        assert_ne!(a.block_hashes[1], m.block_hashes[1]);
        // A longer prompt with the same start shares its blocks.
        let longer = tokenize(
            [words(16, "a").as_str(), words(16, "b").as_str(), "tail"],
            16,
        );
        assert_eq!(&longer.block_hashes[..2], &a.block_hashes[..]);
        assert_ne!(longer.digest, a.digest);
    }

    #[test]
    fn token_ids_are_pinned() {
        // The token id of a word is part of the contract between processes.
        assert_eq!(token_id("hello"), xxh3_64_with_seed(b"hello", TOKEN_SEED));
        assert_ne!(token_id("hello"), token_id("hellO"));
    }
}
