//! The index's hash table: block hash → entry number, sized once for the budget.
//!
//! Why not `HashMap`: the index removes and inserts a block for every new block once it is full,
//! and a swiss table then fills with tombstones; at more than half its capacity it clears them
//! by doubling, so a full index's table ended about twice the size it started at (measured: 4.7
//! MiB grew to 6.7 MiB for a 65,536-block index over 200k sharegpt requests), and `serve`'s RSS
//! grew with it. This table is open addressing with linear probing and backward-shift deletion
//! (no tombstones), at most half full by construction, so it never grows: 4 bytes per slot and
//! 2-4 slots per tracked block. The keys live in the index's entries; every operation reads them
//! through `key_of`.

/// An empty slot. A used one holds entry number + 1 in its low [`ENTRY_BITS`] bits and a tag
/// of the key's hash in the rest, so a probe that meets another key rarely reads its entry
/// (a cache miss) only to find it is not the one.
const EMPTY: u32 = 0;
/// Bits of a slot that hold the entry number + 1: the index's budget is at most 2^28 blocks.
pub const ENTRY_BITS: u32 = 28;
const ENTRY_MASK: u32 = (1 << ENTRY_BITS) - 1;

/// A random odd multiplier per table (multiply-shift hashing): spreads sequential keys
/// (Mooncake's small `hash_ids`) as well as xxh3's, and a client cannot pick prompts whose
/// blocks share a home. Block hashes are xxh3 under a fixed seed (router replicas must agree
/// on them), so with a fixed multiplier anyone could search offline for blocks that land in one
/// run of the table and make every probe walk it. Where an entry sits never changes what a
/// lookup finds, so decisions stay deterministic.
fn random_mix() -> u64 {
    use std::hash::BuildHasher;
    // The standard library's per-process random keys (as every `HashMap` uses).
    std::collections::hash_map::RandomState::new().hash_one(0x9e37_79b9_7f4a_7c15u64) | 1
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct BlockTable {
    slots: Vec<u32>,
    mix: u64,
    mask: usize,
    shift: u32,
    len: usize,
}

impl BlockTable {
    /// A table for at most `max_items` keys (a power of two of at least twice as many slots,
    /// zeroed: pages are only committed as they are used).
    pub fn new(max_items: usize) -> Self {
        let n = max_items.max(8).saturating_mul(2).next_power_of_two();
        Self {
            slots: vec![EMPTY; n],
            mix: random_mix(),
            mask: n - 1,
            shift: 64 - n.trailing_zeros(),
            len: 0,
        }
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bytes of the slot array.
    pub fn bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<u32>()
    }

    fn home(&self, hash: u64) -> usize {
        (hash.wrapping_mul(self.mix) >> self.shift) as usize
    }
    /// The tag bits of `hash` (from its low bits: `home` uses the high bits of the product).
    fn tag(hash: u64) -> u32 {
        (hash as u32) & !ENTRY_MASK
    }

    fn find(&self, hash: u64, key_of: impl Fn(u32) -> u64) -> Option<usize> {
        let tag = Self::tag(hash);
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if s & !ENTRY_MASK == tag && key_of((s & ENTRY_MASK) - 1) == hash {
                return Some(i);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The entry of `hash`.
    pub fn get(&self, hash: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        self.find(hash, key_of)
            .map(|i| (self.slots[i] & ENTRY_MASK) - 1)
    }

    /// Adds `hash` → `entry`. The caller keeps `hash` absent and at most `max_items` held (a
    /// full table would probe forever, so that is checked).
    pub fn insert(&mut self, hash: u64, entry: u32) {
        assert!(self.len < self.slots.len() / 2, "block table over its size");
        assert!(entry < ENTRY_MASK, "entry number past the table's bits");
        let mut i = self.home(hash);
        while self.slots[i] != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.slots[i] = Self::tag(hash) | (entry + 1);
        self.len += 1;
    }

    /// Removes `hash`; returns its entry.
    pub fn remove(&mut self, hash: u64, key_of: impl Fn(u32) -> u64) -> Option<u32> {
        let at = self.find(hash, &key_of)?;
        let entry = (self.slots[at] & ENTRY_MASK) - 1;
        self.slots[at] = EMPTY;
        self.len -= 1;
        // Backward shift: move each later key of the run whose home is not between the hole and
        // it back into the hole, so that a probe never stops early at the emptied slot.
        let mut hole = at;
        let mut j = (at + 1) & self.mask;
        loop {
            let s = self.slots[j];
            if s == EMPTY {
                break;
            }
            let home = self.home(key_of((s & ENTRY_MASK) - 1));
            if (j.wrapping_sub(home) & self.mask) >= (j.wrapping_sub(hole) & self.mask) {
                self.slots[hole] = s;
                self.slots[j] = EMPTY;
                hole = j;
            }
            j = (j + 1) & self.mask;
        }
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Against a `HashMap`, under inserts and removes of colliding small keys: every key
        /// stays findable, removed ones are gone, and the size never changes.
        #[test]
        fn agrees_with_a_hash_map(ops in proptest::collection::vec((0u64..64, any::<bool>()), 1..400)) {
            let mut keys: Vec<u64> = Vec::new();
            let mut t = BlockTable::new(64);
            let size = t.bytes();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (k, add) in ops {
                let key = k * 1_000_003; // spread a little, still colliding in 128 slots
                if add && !model.contains_key(&key) && model.len() < 64 {
                    let e = keys.len() as u32;
                    keys.push(key);
                    t.insert(key, e);
                    model.insert(key, e);
                } else if !add {
                    let got = t.remove(key, |e| keys[e as usize]);
                    prop_assert_eq!(got, model.remove(&key));
                }
                prop_assert_eq!(t.len(), model.len());
                for (&k, &e) in &model {
                    prop_assert_eq!(t.get(k, |e| keys[e as usize]), Some(e));
                }
            }
            prop_assert_eq!(t.bytes(), size);
        }
    }

    #[test]
    fn each_table_places_keys_its_own_way_and_finds_them_all() {
        // Sequential keys, as Mooncake's hash ids are.
        let keys: Vec<u64> = (0..1000).collect();
        let (mut a, mut b) = (BlockTable::new(1024), BlockTable::new(1024));
        for (e, &k) in keys.iter().enumerate() {
            a.insert(k, e as u32);
            b.insert(k, e as u32);
        }
        assert_ne!(a.mix, b.mix, "two tables drew the same multiplier");
        assert_ne!(
            a.slots, b.slots,
            "the same layout under different multipliers"
        );
        for (e, &k) in keys.iter().enumerate() {
            assert_eq!(a.get(k, |i| keys[i as usize]), Some(e as u32));
            assert_eq!(b.get(k, |i| keys[i as usize]), Some(e as u32));
        }
        assert_eq!(a.mix & 1, 1, "odd: a multiplier that loses no bit");
    }

    #[test]
    fn sized_for_twice_the_items() {
        assert_eq!(BlockTable::new(1 << 20).bytes(), 4 << 21);
        assert_eq!(BlockTable::new(65_536).bytes(), 4 << 17);
        assert_eq!(BlockTable::new(1).bytes(), 4 * 16);
    }
}
