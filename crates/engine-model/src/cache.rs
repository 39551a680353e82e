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
/// Cloned only to look ahead (what a request would meet if sent now; see
/// [`crate::Engine::first_token_if_sent`]).
#[derive(Debug, Clone)]
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
    /// What became findable or was evicted since last taken, when recorded (an engine that
    /// publishes KV events; see [`PrefixCache::record_changes`]).
    changes: Option<Vec<CacheChange>>,
}

/// A change of what the cache holds, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheChange {
    /// The block with this chained hash became findable ([`PrefixCache::commit`]).
    Stored(u64),
    /// It was evicted.
    Evicted(u64),
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
            changes: None,
        }
    }

    /// From now on, records every block stored and evicted, for [`PrefixCache::take_changes`].
    pub fn record_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// Appends the changes recorded since the last call to `out`, in order.
    pub fn take_changes(&mut self, out: &mut Vec<CacheChange>) {
        if let Some(c) = self.changes.as_mut() {
            out.append(c);
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

    /// Evicts unreferenced blocks until the cache is within its capacity again: after a request
    /// that ran overcommitted ([`PrefixCache::allocate_overcommit`]) released its blocks.
    /// Otherwise they stayed cached beyond the capacity until something else needed room, and a
    /// 300k-token prompt sent twice to a 65k-token cache was a hit for all but one token.
    pub fn trim_to_capacity(&mut self) {
        while self.occupied_blocks() > self.capacity && self.evictable > 0 {
            self.evict_one();
        }
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
        if let Some(c) = self.changes.as_mut() {
            c.push(CacheChange::Stored(hash));
        }
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
        if let Some(c) = self.changes.as_mut() {
            c.push(CacheChange::Evicted(self.slots[s as usize].hash));
        }
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
mod tests;
