//! The mock engine's text model: one token per whitespace-separated word, a word's token id
//! xxh3-64 of its bytes with [`TOKEN_SEED`]. Workloads the project generates render one token
//! as one word, so this counts their tokens exactly; the mock engine's KV events carry the low
//! 32 bits of each id (a vocabulary index is 32 bits in vLLM's events), and so do [`ids`].

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of token ids. Part of the contract: changing it changes every block hash and every
/// token id the mock engine publishes.
pub const TOKEN_SEED: u64 = 0x6d6f_636b_746f_6b31; // "mocktok1"

/// Token id of one word.
pub fn token_id(word: &str) -> u64 {
    xxh3_64_with_seed(word.as_bytes(), TOKEN_SEED)
}

/// The 32-bit ids of `text`'s words, as the mock engine reports them in `BlockStored`.
pub fn ids(text: &str) -> Vec<u32> {
    text.split_whitespace()
        .map(|w| token_id(w) as u32)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatTokenizer, Message};

    #[test]
    fn chat_contents_are_their_words_in_order() {
        let t = ChatTokenizer::words();
        let m = [
            Message {
                role: "system",
                content: "keep it short",
            },
            Message {
                role: "user",
                content: "  why\tnot\n",
            },
        ];
        let ids = t.chat_ids(&m).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ids, super::ids("keep it short why not"));
        assert_eq!(ids.len(), 5);
        assert_eq!(ids[3], token_id("why") as u32);
        assert_ne!(ids[0], ids[1]);
        assert_eq!(t.prompt_ids("a b").map(|v| v.len()).ok(), Some(2));
        assert!(t.has_template());
        let named = ChatTokenizer::from_setting(std::path::Path::new(crate::WORDS), None);
        assert!(matches!(named, Ok(t) if format!("{t:?}") == "ChatTokenizer(words)"));
    }
}
