//! The request's chain of block hashes: the canonical text (characters for OpenAI bodies, bytes
//! for the native API) cut into fixed blocks, each hash covering everything before it.
//!
//! Block `i`'s hash is xxh3-64 of the block's bytes seeded with block `i - 1`'s hash; block 0 is
//! seeded with the hash of the routing group ([`KeyHash::new`] of the group and no text), so two
//! tenants' equal prompts never share a block. Equal hashes at position `i` therefore mean equal
//! text (and group) up to the end of block `i`: a prefix match is a walk along the chain. A
//! trailing partial block has no hash; [`Chain::units`] still counts it.
//!
//! The chain reads at most [`ChainSpec::max_units`] units: the cost of a very long prompt's tail
//! is the same on every instance, so it cannot change a choice.

use crate::extract::text::take_chars;
use crate::KeyHash;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// How a chain is cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChainSpec {
    /// Units (characters or bytes) per block.
    pub block_units: u32,
    /// Units read at most (a multiple of nothing in particular; a partial last block is dropped).
    pub max_units: u32,
}

impl ChainSpec {
    /// Default block: 128 characters, about 32 tokens of English text (two vLLM blocks of 16).
    pub const DEFAULT_BLOCK_UNITS: u32 = 128;
    /// Default bound: 256 Ki characters, about 64k tokens.
    pub const DEFAULT_MAX_UNITS: u32 = 256 * 1024;

    /// The defaults.
    pub const DEFAULT: ChainSpec = ChainSpec {
        block_units: Self::DEFAULT_BLOCK_UNITS,
        max_units: Self::DEFAULT_MAX_UNITS,
    };
}

impl Default for ChainSpec {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A request's block chain and its length.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// Hash of each full block, in order.
    pub blocks: Vec<u64>,
    /// Units of prompt read (at most the spec's `max_units`).
    pub units: u32,
    /// A hash of the routing group, when there is one (for logs: the id itself may name a
    /// tenant; the hash does not, and still tells groups apart).
    pub group: Option<u64>,
}

impl Chain {
    /// The chain of `text` (characters are Unicode scalar values) under `group`.
    pub fn of_chars(group: Option<&str>, text: &str, spec: ChainSpec) -> Chain {
        Self::of_text(group, text, text.is_ascii(), spec)
    }

    /// [`Chain::of_chars`] for a text whose ASCII-ness its builder already knows (`ascii` must
    /// be `text.is_ascii()`): the extractor tracks it while copying, so the chain does not
    /// read the text an extra time to find out.
    pub(crate) fn of_text(group: Option<&str>, text: &str, ascii: bool, spec: ChainSpec) -> Chain {
        debug_assert_eq!(ascii, text.is_ascii());
        let mut blocks = Vec::new();
        let seed = group_seed(group);
        let units = chars_into(seed, text, ascii, spec, &mut blocks);
        Chain {
            blocks,
            units,
            group: group.is_some().then_some(seed),
        }
    }

    /// The chain of raw bytes (the native API) under `group`.
    pub fn of_bytes(group: Option<&str>, bytes: &[u8], spec: ChainSpec) -> Chain {
        let block = spec.block_units.max(1) as usize;
        let bytes = bytes.get(..spec.max_units as usize).unwrap_or(bytes);
        let first = group_seed(group);
        let mut seed = first;
        let blocks = bytes
            .chunks_exact(block)
            .map(|b| {
                seed = xxh3_64_with_seed(b, seed);
                seed
            })
            .collect();
        Chain {
            blocks,
            units: bytes.len() as u32,
            group: group.is_some().then_some(first),
        }
    }
}

/// The seed of block 0: the key hash of the group with no text.
fn group_seed(group: Option<&str>) -> u64 {
    KeyHash::new(group, b"").0
}

/// Appends the block hashes of `text`, chained from `seed` (the group's), to `out`; returns the
/// characters read.
fn chars_into(seed: u64, text: &str, ascii: bool, spec: ChainSpec, out: &mut Vec<u64>) -> u32 {
    let block = spec.block_units.max(1) as usize;
    let mut seed = seed;
    let mut read = 0usize;
    let max = spec.max_units as usize;
    let mut rest = text;
    // At most one block per `block` bytes: reserved once, not grown push by push.
    out.reserve(text.len().min(max) / block);
    if ascii {
        // Fast path: one byte per character.
        let cut = &text.as_bytes()[..text.len().min(max)];
        for b in cut.chunks_exact(block) {
            seed = xxh3_64_with_seed(b, seed);
            out.push(seed);
        }
        return cut.len() as u32;
    }
    while read < max && !rest.is_empty() {
        let want = block.min(max - read);
        let (head, n) = take_chars(rest, want);
        read += n;
        rest = &rest[head.len()..];
        if n == block {
            seed = xxh3_64_with_seed(head.as_bytes(), seed);
            out.push(seed);
        }
    }
    read as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SPEC: ChainSpec = ChainSpec {
        block_units: 4,
        max_units: 1 << 20,
    };

    #[test]
    fn equal_prefixes_share_blocks_until_they_differ() {
        let a = Chain::of_chars(None, "abcdefghijkl", SPEC);
        let b = Chain::of_chars(None, "abcdefgXijklmn", SPEC);
        assert_eq!(a.blocks.len(), 3);
        assert_eq!(b.blocks.len(), 3);
        assert_eq!(a.blocks[0], b.blocks[0]);
        assert_ne!(a.blocks[1], b.blocks[1]);
        assert_ne!(a.blocks[2], b.blocks[2], "a chain never re-converges");
        assert_eq!((a.units, b.units), (12, 14));
    }

    #[test]
    fn groups_separate_and_bytes_agree_with_ascii_chars() {
        let a = Chain::of_chars(Some("t1"), "abcdefgh", SPEC);
        let b = Chain::of_chars(Some("t2"), "abcdefgh", SPEC);
        assert_ne!(a.blocks[0], b.blocks[0]);
        assert_eq!(a, Chain::of_bytes(Some("t1"), b"abcdefgh", SPEC));
    }

    #[test]
    fn the_bound_stops_reading() {
        let spec = ChainSpec {
            block_units: 4,
            max_units: 10,
        };
        let c = Chain::of_chars(None, &"x".repeat(100), spec);
        assert_eq!((c.blocks.len(), c.units), (2, 10));
        let c = Chain::of_chars(None, &"é".repeat(100), spec);
        assert_eq!((c.blocks.len(), c.units), (2, 10));
        let c = Chain::of_bytes(None, &[7u8; 100], spec);
        assert_eq!((c.blocks.len(), c.units), (2, 10));
    }

    proptest! {
        #[test]
        fn blocks_are_characters_not_bytes(s in "\\PC{0,60}", block in 1u32..9) {
            let spec = ChainSpec { block_units: block, max_units: 1 << 20 };
            let c = Chain::of_chars(None, &s, spec);
            let chars: Vec<char> = s.chars().collect();
            prop_assert_eq!(c.units as usize, chars.len());
            prop_assert_eq!(c.blocks.len(), chars.len() / block as usize);
            // Same as hashing each block's characters re-encoded.
            let mut seed = KeyHash::new(None, b"").0;
            for (i, chunk) in chars.chunks_exact(block as usize).enumerate() {
                let text: String = chunk.iter().collect();
                seed = xxh3_64_with_seed(text.as_bytes(), seed);
                prop_assert_eq!(c.blocks[i], seed);
            }
        }
    }
}
