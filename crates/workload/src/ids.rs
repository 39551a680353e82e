//! Segment ids and block hashes: who may mint which ids, and how a block of prompt is named.
//!
//! A segment id is 64 bits whose top two bits say which source minted it, so ids from different
//! sources can never be equal (content sharing is only ever claimed within one source):
//!
//! | top bits | source |
//! | --- | --- |
//! | `00` | the seeded generators ([`generator_id`]) |
//! | `01` | chained block hashes: Mooncake traces and the router's access log ([`mooncake_id`]) |
//! | `10` | literal text: ShareGPT files, JSONL `"content"` messages ([`crate::text::text_segment`]) |
//! | `11` | reserved (ids written by users in our JSONL `segments` form may use any value) |
//!
//! All functions are xxh3-64 with fixed seeds, so ids are equal in every process and release.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Top bits of generator-minted ids.
pub const GENERATOR_ID_TAG: u64 = 0b00 << 62;
/// Top bits of ids derived from Mooncake `hash_ids`.
pub const MOONCAKE_ID_TAG: u64 = 0b01 << 62;
/// Top bits of ids derived from literal text.
pub const CONTENT_ID_TAG: u64 = 0b10 << 62;

const LOW_62: u64 = (1 << 62) - 1;
const GENERATOR_SEED: u64 = 0x6765_6e65_7261_746f; // "generato"
const MOONCAKE_SEED: u64 = 0x6d6f_6f6e_6361_6b65; // "mooncake"
const BLOCK_SEED: u64 = 0x626c_6f63_6b68_7368; // "blockhsh"

fn hash_pair(a: u64, b: u64, seed: u64) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&a.to_le_bytes());
    bytes[8..].copy_from_slice(&b.to_le_bytes());
    xxh3_64_with_seed(&bytes, seed)
}

/// A generator segment id chained from `parent` (the id of what precedes it, or a root tag) and
/// `salt` (what distinguishes this segment among the parent's children). Generators chain every
/// id from its predecessor, which is what makes ids prefix-chained.
pub fn generator_id(parent: u64, salt: u64) -> u64 {
    GENERATOR_ID_TAG | (hash_pair(parent, salt, GENERATOR_SEED) & LOW_62)
}

/// The segment id of a Mooncake `hash_id`: a stable mix into the Mooncake id space. Mooncake
/// hash ids are already prefix-chained, so the mix keeps that property.
pub fn mooncake_id(hash_id: u64) -> u64 {
    MOONCAKE_ID_TAG | (xxh3_64_with_seed(&hash_id.to_le_bytes(), MOONCAKE_SEED) & LOW_62)
}

/// The hash of the prompt block that ends at absolute token position `end` (exclusive) and whose
/// last token lies in segment `segment_id`.
///
/// Why (segment id, end) suffices: segment ids are prefix-chained, so two prompts holding the
/// same id hold the same content before that segment and the same tokens inside it, which also
/// fixes where the segment starts. Equal (id, end) therefore means equal content up to `end`, and
/// the hash needs no pass over earlier blocks or tokens (O(1) per block).
#[inline]
pub fn block_hash(segment_id: u64, end: u64) -> u64 {
    hash_pair(segment_id, end, BLOCK_SEED)
}

/// The id of the unique tail segment of a Mooncake request whose `input_length` runs past its
/// `hash_ids` (the content there is unknown, so it is assumed shared with nothing): chained from
/// the last hash id's segment (or 0) and the request's line number.
pub fn mooncake_tail_id(parent: u64, line: u64) -> u64 {
    MOONCAKE_ID_TAG | (hash_pair(parent, line, MOONCAKE_SEED ^ 1) & LOW_62)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_spaces_are_disjoint() {
        for x in 0..1000u64 {
            assert_eq!(generator_id(x, x + 1) >> 62, 0b00);
            assert_eq!(mooncake_id(x) >> 62, 0b01);
        }
    }

    #[test]
    fn golden_values() {
        // Part of the contract: traces replayed by different releases must name blocks alike.
        assert_eq!(block_hash(1, 16), GOLDEN_BLOCK);
        assert_eq!(mooncake_id(0), GOLDEN_MOONCAKE);
    }

    const GOLDEN_BLOCK: u64 = 435_526_049_711_127_095;
    const GOLDEN_MOONCAKE: u64 = 6_532_268_480_181_923_984;
}
