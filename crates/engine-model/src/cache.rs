//! Prefix cache of hash-chained blocks with LRU eviction of unreferenced blocks.
//!
//! The KV cache of an engine is a pool of `capacity` blocks. A block is in one of three states:
//! - **private**: allocated to a running request but not (or not yet) shareable: blocks whose
//!   prompt tokens are not computed yet, the partial last block, generated tokens, duplicates of a
//!   block another request cached first. Only counted ([`PrefixCache::private_blocks`]).
//! - **cached, referenced**: a computed full prompt block, findable by its chained hash, in use by
//!   at least one running request. Never evicted.
//! - **cached, unreferenced**: findable, in use by nobody, kept on an LRU list and evicted
//!   (least recently released first) when a new allocation needs room.
//!
//! Every operation is O(1) per block: a hash map from block hash to a slot of a slab, and an
//! intrusive doubly linked LRU list threaded through the slab.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Slot index meaning "no slot" in the intrusive list.
const NIL: u32 = u32::MAX;

/// Hasher for keys that are already hashes (chained block hashes), with one cheap mixing step so
/// that small or sequential ids (e.g. Mooncake `hash_ids`) still spread over the table.
#[derive(Default, Clone, Copy)]
struct BlockHashHasher(u64);

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        // The finalizer of SplitMix64 (Steele, Lea, Flood 2014): a bijective mix of all 64 bits.
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by `u64` keys; fold anything else in for completeness.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type BlockMap = HashMap<u64, u32, BuildHasherDefault<BlockHashHasher>>;

/// Stale map entries tolerated beyond as many as there are live blocks, so a small cache does
/// not sweep at every commit.
const STALE_SLACK: usize = 4096;

/// One cached block in the slab.
#[derive(Debug, Clone, Copy)]
struct Slot {
    hash: u64,
    /// Running requests using the block; on the LRU list exactly when 0.
    refs: u32,
    prev: u32,
    next: u32,
    /// Cached now; false once evicted (its slot waits on the free list).
    live: bool,
}

/// Result of looking a request's blocks up in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixMatch {
    /// Leading blocks of the request found in the cache.
    pub blocks: usize,
    /// Of those, blocks nobody references now (they sit on the LRU list and would stop being
    /// evictable once the request takes them).
    pub unreferenced: usize,
}

/// Block prefix cache: capacity accounting, reference counts and LRU eviction.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: u32,
    map: BlockMap,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    /// Least recently released unreferenced block (evicted first).
    lru_head: u32,
    /// Most recently released unreferenced block.
    lru_tail: u32,
    /// Unreferenced cached blocks (length of the LRU list).
    evictable: u32,
    /// Blocks allocated to running requests outside the cache.
    private: u32,
    /// Blocks evicted since creation.
    evictions: u64,
}

impl PrefixCache {
    /// An empty cache of `capacity` blocks.
    pub fn new(capacity: u32) -> Self {
        let reserve = capacity.min(1 << 20) as usize;
        let mut map = BlockMap::default();
        map.reserve(reserve);
        Self {
            capacity,
            map,
            slots: Vec::with_capacity(reserve),
            free_slots: Vec::new(),
            lru_head: NIL,
            lru_tail: NIL,
            evictable: 0,
            private: 0,
            evictions: 0,
        }
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Blocks findable by hash (referenced or not).
    pub fn cached_blocks(&self) -> u32 {
        // Live slots: every slot not on the free list. (The map may hold more entries:
        // eviction leaves its entry behind, see [`PrefixCache::slot_of`].)
        (self.slots.len() - self.free_slots.len()) as u32
    }

    /// The live slot holding `hash`. Eviction does not remove the block's map entry: the
    /// entry of a block evicted long ago is a cache miss in the table, and at one eviction
    /// per new block it cost more than a third of a long-prompt simulation. A stale entry
    /// points at a slot that is free or holds another hash, so it reads as absent, and
    /// [`PrefixCache::commit`] sweeps the stale ones out once they outnumber the live.
    fn slot_of(&self, hash: u64) -> Option<u32> {
        let s = *self.map.get(&hash)?;
        let slot = &self.slots[s as usize];
        (slot.live && slot.hash == hash).then_some(s)
    }

    /// Cached blocks nobody uses: what eviction can reclaim.
    pub fn evictable_blocks(&self) -> u32 {
        self.evictable
    }

    /// Blocks allocated to running requests outside the cache.
    pub fn private_blocks(&self) -> u32 {
        self.private
    }

    /// Blocks in use by running requests (referenced cached blocks plus private blocks).
    pub fn used_blocks(&self) -> u32 {
        self.cached_blocks() - self.evictable + self.private
    }

    /// Blocks holding anything (used or cached); may exceed capacity only through
    /// [`PrefixCache::allocate_overcommit`].
    pub fn occupied_blocks(&self) -> u32 {
        self.cached_blocks() + self.private
    }

    /// Blocks neither used nor cached.
    pub fn free_blocks(&self) -> u32 {
        self.capacity.saturating_sub(self.occupied_blocks())
    }

    /// Blocks evicted since creation.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether a block with this chained hash is cached.
    pub fn contains(&self, hash: u64) -> bool {
        self.slot_of(hash).is_some()
    }

    /// Reference count of a cached block (`None` when not cached).
    pub fn refs(&self, hash: u64) -> Option<u32> {
        self.slot_of(hash).map(|s| self.slots[s as usize].refs)
    }

    /// Longest run of leading `hashes` present in the cache. O(matched blocks + 1).
    pub fn longest_prefix(&self, hashes: &[u64]) -> PrefixMatch {
        let mut m = PrefixMatch::default();
        for h in hashes {
            match self.slot_of(*h) {
                Some(s) => {
                    m.blocks += 1;
                    if self.slots[s as usize].refs == 0 {
                        m.unreferenced += 1;
                    }
                }
                None => break,
            }
        }
        m
    }

    /// Takes a reference on each of the leading `hashes` (all must be cached, as reported by
    /// [`PrefixCache::longest_prefix`]), appending their slots to `slots_out` for
    /// [`PrefixCache::release`]. Returns how many were taken (stops at the first missing hash).
    pub fn acquire_prefix(&mut self, hashes: &[u64], slots_out: &mut Vec<u32>) -> usize {
        let mut taken = 0;
        for h in hashes {
            let Some(s) = self.slot_of(*h) else { break };
            if self.slots[s as usize].refs == 0 {
                self.lru_unlink(s);
                self.evictable -= 1;
            }
            self.slots[s as usize].refs += 1;
            slots_out.push(s);
            taken += 1;
        }
        taken
    }

    /// Blocks that could be allocated now after evicting every unreferenced block, keeping
    /// `pinned` of the evictable ones (blocks about to be referenced). Negative while overcommitted.
    pub fn room(&self, pinned: u32) -> i64 {
        i64::from(self.capacity) + i64::from(self.evictable)
            - i64::from(pinned.min(self.evictable))
            - i64::from(self.occupied_blocks())
    }

    /// Allocates `n` private blocks, evicting least recently released unreferenced blocks as
    /// needed. Returns false, changing nothing, when even evicting everything evictable would not
    /// make room.
    pub fn allocate(&mut self, n: u32) -> bool {
        if i64::from(n) > self.room(0) {
            return false;
        }
        while self.free_blocks() < n && self.evictable > 0 {
            self.evict_one();
        }
        self.private += n;
        true
    }

    /// Allocates `n` private blocks even beyond capacity, after evicting every unreferenced block.
    /// For a request larger than the whole cache, so that it runs alone instead of deadlocking;
    /// returns how many blocks are now allocated beyond capacity.
    pub fn allocate_overcommit(&mut self, n: u32) -> u32 {
        while self.free_blocks() < n && self.evictable > 0 {
            self.evict_one();
        }
        self.private += n;
        self.occupied_blocks().saturating_sub(self.capacity)
    }

    /// Returns `n` private blocks to the free pool.
    pub fn free_private(&mut self, n: u32) {
        debug_assert!(
            n <= self.private,
            "freeing more private blocks than allocated"
        );
        self.private -= n.min(self.private);
    }

    /// Turns one private block, whose tokens are now computed, into a cached block with one
    /// reference, findable by `hash`. Returns its slot, or `None` when a block with that hash is
    /// already cached (the block then stays private, as a duplicate, until released).
    pub fn commit(&mut self, hash: u64) -> Option<u32> {
        if self.private == 0 || self.slot_of(hash).is_some() {
            return None;
        }
        let slot = Slot {
            hash,
            refs: 1,
            prev: NIL,
            next: NIL,
            live: true,
        };
        let s = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = slot;
                s
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.map.insert(hash, s);
        self.private -= 1;
        if self.map.len() > 2 * self.cached_blocks() as usize + STALE_SLACK {
            let slots = &self.slots;
            self.map.retain(|h, s| {
                let slot = &slots[*s as usize];
                slot.live && slot.hash == *h
            });
        }
        Some(s)
    }

    /// Drops one reference on a cached block (a slot from [`PrefixCache::acquire_prefix`] or
    /// [`PrefixCache::commit`]); at zero it becomes the most recently used evictable block.
    pub fn release(&mut self, slot: u32) {
        let Some(entry) = self.slots.get_mut(slot as usize) else {
            debug_assert!(false, "release of unknown slot {slot}");
            return;
        };
        debug_assert!(entry.refs > 0, "release of unreferenced slot {slot}");
        if entry.refs == 0 {
            return;
        }
        entry.refs -= 1;
        if entry.refs == 0 {
            self.lru_push_tail(slot);
            self.evictable += 1;
        }
    }

    /// Chained hashes of the evictable blocks, least recently released first (for tests and
    /// inspection; O(evictable)).
    pub fn lru_order(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.evictable as usize);
        let mut s = self.lru_head;
        while s != NIL {
            out.push(self.slots[s as usize].hash);
            s = self.slots[s as usize].next;
        }
        out
    }

    fn evict_one(&mut self) {
        let s = self.lru_head;
        if s == NIL {
            return;
        }
        self.lru_unlink(s);
        self.evictable -= 1;
        self.slots[s as usize].live = false;
        self.free_slots.push(s);
        self.evictions += 1;
    }

    fn lru_unlink(&mut self, s: u32) {
        let Slot { prev, next, .. } = self.slots[s as usize];
        if prev == NIL {
            self.lru_head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.lru_tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        let e = &mut self.slots[s as usize];
        e.prev = NIL;
        e.next = NIL;
    }

    fn lru_push_tail(&mut self, s: u32) {
        let tail = self.lru_tail;
        {
            let e = &mut self.slots[s as usize];
            e.prev = tail;
            e.next = NIL;
        }
        if tail == NIL {
            self.lru_head = s;
        } else {
            self.slots[tail as usize].next = s;
        }
        self.lru_tail = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Caches `hashes` as one request would: allocate, commit each, release tail first.
    fn cache_chain(c: &mut PrefixCache, hashes: &[u64]) {
        assert!(c.allocate(hashes.len() as u32));
        let slots: Vec<u32> = hashes.iter().filter_map(|&h| c.commit(h)).collect();
        for &s in slots.iter().rev() {
            c.release(s);
        }
    }

    #[test]
    fn lookup_finds_longest_cached_prefix() {
        let mut c = PrefixCache::new(10);
        cache_chain(&mut c, &[1, 2, 3]);
        assert_eq!(c.longest_prefix(&[1, 2, 3, 4]).blocks, 3);
        assert_eq!(c.longest_prefix(&[1, 2, 9, 3]).blocks, 2);
        assert_eq!(c.longest_prefix(&[7, 1, 2]).blocks, 0);
        assert_eq!(c.longest_prefix(&[1, 2, 3]).unreferenced, 3);
    }

    #[test]
    fn eviction_takes_least_recently_released_and_tail_first() {
        let mut c = PrefixCache::new(6);
        cache_chain(&mut c, &[1, 2, 3]);
        cache_chain(&mut c, &[10, 20, 30]);
        // Released tail first: the tail of the older chain is evicted first.
        assert_eq!(c.lru_order(), vec![3, 2, 1, 30, 20, 10]);
        assert!(c.allocate(2));
        assert!(!c.contains(3) && !c.contains(2));
        assert!(c.contains(1) && c.contains(30));
        assert_eq!(c.evictions(), 2);
    }

    #[test]
    fn referenced_blocks_are_never_evicted() {
        let mut c = PrefixCache::new(4);
        cache_chain(&mut c, &[1, 2]);
        cache_chain(&mut c, &[5, 6]);
        let mut slots = Vec::new();
        assert_eq!(c.acquire_prefix(&[1, 2], &mut slots), 2);
        assert_eq!(c.evictable_blocks(), 2);
        assert!(!c.allocate(3), "only 2 blocks are reclaimable");
        assert_eq!(c.cached_blocks(), 4, "a failed allocation changes nothing");
        assert!(c.allocate(2));
        assert!(c.contains(1) && c.contains(2) && !c.contains(5) && !c.contains(6));
        for s in slots {
            c.release(s);
        }
        assert_eq!(c.evictable_blocks(), 2);
    }

    #[test]
    fn evicted_entries_read_as_absent_and_are_swept() {
        let mut c = PrefixCache::new(4);
        cache_chain(&mut c, &[1, 2, 3, 4]);
        assert!(c.allocate(4));
        c.free_private(4);
        assert!(
            !c.contains(1) && c.refs(4).is_none(),
            "evicted, though its entry stayed"
        );
        // A slot reused for another hash does not answer for the evicted one.
        cache_chain(&mut c, &[7]);
        assert!(c.contains(7) && !c.contains(1) && !c.contains(4));
        assert_eq!(c.cached_blocks(), 1);
        // A block evicted and cached again is found in its new slot.
        cache_chain(&mut c, &[1]);
        assert!(c.contains(1));
        // Churn through many hashes: the map keeps at most twice the live blocks plus slack.
        for round in 0..3_000u64 {
            cache_chain(&mut c, &[100 + 3 * round, 101 + 3 * round, 102 + 3 * round]);
        }
        assert!(c.cached_blocks() <= 4);
        assert!(
            c.map.len() <= 2 * 4 + STALE_SLACK,
            "{} entries",
            c.map.len()
        );
    }

    #[test]
    fn duplicate_commit_stays_private() {
        let mut c = PrefixCache::new(4);
        assert!(c.allocate(2));
        assert!(c.commit(7).is_some());
        assert!(c.commit(7).is_none());
        assert_eq!(c.private_blocks(), 1);
        assert_eq!(c.used_blocks(), 2);
    }

    #[test]
    fn overcommit_evicts_everything_then_exceeds() {
        let mut c = PrefixCache::new(3);
        cache_chain(&mut c, &[1, 2]);
        assert!(!c.allocate(5));
        assert_eq!(c.allocate_overcommit(5), 2);
        assert_eq!(c.cached_blocks(), 0);
        // While overcommitted, an evictable block does not make room (commit turns one of the
        // 5 private blocks into it).
        let s = c.commit(9).expect("new hash");
        c.release(s);
        assert_eq!(c.room(0), -1);
        assert!(!c.allocate(1));
        c.free_private(4);
        assert!(c.allocate(1));
        c.free_private(1);
        assert_eq!((c.free_blocks(), c.evictable_blocks()), (2, 1));
    }

    /// Reference model: a plain list in LRU order, linear scans.
    #[derive(Default)]
    struct Model {
        capacity: u32,
        cached: Vec<(u64, u32)>, // (hash, refs) in insertion order
        lru: Vec<u64>,           // unreferenced, least recent first
        private: u32,
    }

    impl Model {
        fn free(&self) -> u32 {
            self.capacity
                .saturating_sub(self.cached.len() as u32 + self.private)
        }
        fn allocate(&mut self, n: u32) -> bool {
            if n > self.free() + self.lru.len() as u32 {
                return false;
            }
            while self.free() < n {
                let h = self.lru.remove(0);
                self.cached.retain(|e| e.0 != h);
            }
            self.private += n;
            true
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate(u32),
        Commit(u64),
        Acquire(u64),
        Release(usize),
        Free(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u32..4).prop_map(Op::Allocate),
            (0u64..12).prop_map(Op::Commit),
            (0u64..12).prop_map(Op::Acquire),
            (0usize..16).prop_map(Op::Release),
            (1u32..3).prop_map(Op::Free),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// The slab/intrusive-list cache behaves exactly like a naive list model, and never holds
        /// more than its capacity.
        #[test]
        fn matches_reference_model(ops in proptest::collection::vec(op(), 1..120)) {
            let mut c = PrefixCache::new(8);
            let mut m = Model { capacity: 8, ..Model::default() };
            let mut held: Vec<(u32, u64)> = Vec::new(); // (slot, hash) references we hold
            for op in ops {
                match op {
                    Op::Allocate(n) => prop_assert_eq!(c.allocate(n), m.allocate(n)),
                    Op::Commit(h) => {
                        let got = c.commit(h);
                        let expect = m.private > 0 && !m.cached.iter().any(|e| e.0 == h);
                        prop_assert_eq!(got.is_some(), expect);
                        if let Some(s) = got {
                            m.private -= 1;
                            m.cached.push((h, 1));
                            held.push((s, h));
                        }
                    }
                    Op::Acquire(h) => {
                        let mut slots = Vec::new();
                        let n = c.acquire_prefix(&[h], &mut slots);
                        let found = m.cached.iter().position(|e| e.0 == h);
                        prop_assert_eq!(n, usize::from(found.is_some()));
                        if let Some(i) = found {
                            if m.cached[i].1 == 0 {
                                m.lru.retain(|&x| x != h);
                            }
                            m.cached[i].1 += 1;
                            held.push((slots[0], h));
                        }
                    }
                    Op::Release(i) => {
                        if !held.is_empty() {
                            let (s, h) = held.remove(i % held.len());
                            c.release(s);
                            let e = m.cached.iter_mut().find(|e| e.0 == h).expect("model has it");
                            e.1 -= 1;
                            if e.1 == 0 {
                                m.lru.push(h);
                            }
                        }
                    }
                    Op::Free(n) => {
                        let n = n.min(m.private);
                        c.free_private(n);
                        m.private -= n;
                    }
                }
                prop_assert_eq!(c.lru_order(), m.lru.clone());
                prop_assert_eq!(c.cached_blocks(), m.cached.len() as u32);
                prop_assert_eq!(c.private_blocks(), m.private);
                prop_assert!(c.occupied_blocks() <= c.capacity());
            }
        }
    }
}
