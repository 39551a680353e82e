//! The request's chain of block hashes: the canonical text (characters for OpenAI bodies, bytes
//! for the native API) cut into fixed blocks, each hash covering everything before it.
//!
//! Block `i`'s hash is xxh3-64 of the block's bytes seeded with block `i - 1`'s hash; block 0 is
//! seeded with the hash of no group ([`KeyHash::new`] of no group and no text). A request with a
//! routing group then has each hash mixed with the group's ([`KeyHash::new`] of the group and no
//! text), so two tenants' equal prompts never share a block. The group is mixed in last, not
//! seeded first, because a body may name its group after its messages (the OpenAI SDKs write
//! `prompt_cache_key` after them): the extractor hashes the text as it decodes it, before it
//! knows the group. Equal hashes at position `i` therefore mean equal text (and group) up to the
//! end of block `i`: a prefix match is a walk along the chain. A trailing partial block has no
//! hash; [`Chain::units`] still counts it.
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
        let mut pending = Vec::new();
        let mut b = ChainBuilder::new(spec, text.len(), &mut pending);
        b.push(text, text.is_ascii());
        b.finish(group)
    }

    /// The chain of raw bytes (the native API) under `group`.
    pub fn of_bytes(group: Option<&str>, bytes: &[u8], spec: ChainSpec) -> Chain {
        let block = spec.block_units.max(1) as usize;
        let bytes = bytes.get(..spec.max_units as usize).unwrap_or(bytes);
        let mut seed = ungrouped_seed();
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
            group: None,
        }
        .grouped(group)
    }

    /// Mixes `group` into every block hash (see the module's comment).
    fn grouped(mut self, group: Option<&str>) -> Chain {
        if let Some(g) = group {
            let seed = KeyHash::new(Some(g), b"").0;
            for h in &mut self.blocks {
                *h = xxh3_64_with_seed(&h.to_le_bytes(), seed);
            }
            self.group = Some(seed);
        }
        self
    }
}

/// The seed of block 0: the key hash of no group and no text.
fn ungrouped_seed() -> u64 {
    KeyHash::new(None, b"").0
}

/// Builds a chain from text handed over in pieces (the extractor's decoded runs between
/// escapes), hashing each whole block straight from the piece that holds it. Only a block that
/// spans pieces is copied, into `pending` (one block at most). Why: a copy of the whole prompt
/// to cut afterwards writes as much fresh memory as the prompt is long per request (40 KB for
/// a long-context prompt, more than a 32 KiB level-1 data cache). The result equals
/// [`Chain::of_chars`] of the pieces joined.
#[derive(Debug)]
pub(crate) struct ChainBuilder<'p> {
    block: usize,
    /// Units (characters) read at most.
    max: usize,
    /// Units still to read before the bound (`max - room` have been read).
    room: usize,
    seed: u64,
    blocks: Vec<u64>,
    /// The bytes of the block being assembled from pieces, and its units so far.
    pending: &'p mut Vec<u8>,
    pending_units: usize,
}

impl<'p> ChainBuilder<'p> {
    /// A builder for `spec`, expecting text of about `len_hint` bytes (it reserves the block
    /// list for that once), assembling split blocks in `pending` (cleared here).
    pub(crate) fn new(spec: ChainSpec, len_hint: usize, pending: &'p mut Vec<u8>) -> Self {
        let block = spec.block_units.max(1) as usize;
        let room = spec.max_units as usize;
        pending.clear();
        Self {
            block,
            max: room,
            room,
            seed: ungrouped_seed(),
            blocks: Vec::with_capacity(len_hint.min(room) / block + 1),
            pending,
            pending_units: 0,
        }
    }

    /// Appends `s`; `ascii` says it is known to be ASCII (false: not known), so blocks are cut
    /// by bytes without counting characters.
    pub(crate) fn push(&mut self, mut s: &str, ascii: bool) {
        debug_assert!(!ascii || s.is_ascii());
        if ascii {
            self.push_bytes(s.as_bytes());
            return;
        }
        while self.room > 0 && !s.is_empty() {
            let want = (self.block - self.pending_units).min(self.room);
            let (head, n) = take_chars(s, want);
            s = &s[head.len()..];
            self.room -= n;
            if self.pending_units == 0 && n == self.block {
                self.seal(head.as_bytes());
            } else {
                self.pending.extend_from_slice(head.as_bytes());
                self.pending_units += n;
                if self.pending_units == self.block {
                    self.seal_pending();
                }
            }
        }
    }

    /// [`ChainBuilder::push`] of ASCII text: one byte per character, whole blocks hashed in
    /// one loop straight from `bytes`.
    fn push_bytes(&mut self, bytes: &[u8]) {
        let mut rest = &bytes[..bytes.len().min(self.room)];
        self.room -= rest.len();
        if self.pending_units > 0 {
            let k = (self.block - self.pending_units).min(rest.len());
            self.pending.extend_from_slice(&rest[..k]);
            self.pending_units += k;
            rest = &rest[k..];
            if self.pending_units < self.block {
                return;
            }
            self.seal_pending();
        }
        let mut blocks = rest.chunks_exact(self.block);
        for b in &mut blocks {
            self.seal(b);
        }
        let tail = blocks.remainder();
        self.pending.extend_from_slice(tail);
        self.pending_units = tail.len();
    }

    fn seal_pending(&mut self) {
        self.seed = xxh3_64_with_seed(self.pending, self.seed);
        self.blocks.push(self.seed);
        self.pending.clear();
        self.pending_units = 0;
    }

    /// Appends one character (an escape's, a separator).
    pub(crate) fn push_char(&mut self, c: char) {
        if self.room == 0 {
            return;
        }
        if let Ok(b) = u8::try_from(c) {
            if b.is_ascii() {
                self.room -= 1;
                self.pending.push(b);
                self.pending_units += 1;
                if self.pending_units == self.block {
                    self.seal_pending();
                }
                return;
            }
        }
        let mut tmp = [0u8; 4];
        self.push(c.encode_utf8(&mut tmp), false);
    }

    /// Units still to read before the bound.
    pub(crate) fn room(&self) -> usize {
        self.room
    }

    #[inline(always)]
    fn seal(&mut self, block: &[u8]) {
        self.seed = xxh3_64_with_seed(block, self.seed);
        self.blocks.push(self.seed);
    }

    /// The chain of everything pushed, under `group`; a partial last block has no hash.
    pub(crate) fn finish(self, group: Option<&str>) -> Chain {
        Chain {
            blocks: self.blocks,
            units: (self.max - self.room) as u32,
            group: None,
        }
        .grouped(group)
    }
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

        #[test]
        fn pieces_build_the_chain_of_their_joined_text(
            pieces in proptest::collection::vec("(\\PC|[a-z ]{1,20}){0,12}", 0..8),
            chars in proptest::collection::vec(any::<char>(), 0..4),
            block in 1u32..9,
            max in 0u32..80,
            group in proptest::option::of("[a-z]{1,8}"),
        ) {
            // Reference: the joined text's characters, cut at `max`, hashed block by block from
            // the ungrouped seed, then each hash mixed with the group's.
            let mut text: String = pieces.concat();
            text.extend(chars.iter());
            let spec = ChainSpec { block_units: block, max_units: max };
            let units: Vec<char> = text.chars().take(max as usize).collect();
            let mut seed = KeyHash::new(None, b"").0;
            let mut expected = Vec::new();
            for chunk in units.chunks_exact(block as usize) {
                seed = xxh3_64_with_seed(chunk.iter().collect::<String>().as_bytes(), seed);
                expected.push(seed);
            }
            if let Some(g) = &group {
                let gs = KeyHash::new(Some(g), b"").0;
                for h in &mut expected {
                    *h = xxh3_64_with_seed(&h.to_le_bytes(), gs);
                }
            }
            let mut pending = Vec::new();
            let mut b = ChainBuilder::new(spec, 7, &mut pending);
            for p in &pieces {
                b.push(p, p.is_ascii());
            }
            for &c in &chars {
                b.push_char(c);
            }
            let c = b.finish(group.as_deref());
            prop_assert_eq!(&c.blocks, &expected);
            prop_assert_eq!(c.units as usize, units.len());
            prop_assert_eq!(c.group.is_some(), group.is_some());
            prop_assert_eq!(c, Chain::of_chars(group.as_deref(), &text, spec));
        }
    }
}
