//! Unit tests of the prefix cache.
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
fn changes_are_recorded_in_order_only_once_asked_for() {
    let mut c = PrefixCache::new(4);
    cache_chain(&mut c, &[1, 2]);
    let mut out = Vec::new();
    c.take_changes(&mut out);
    assert!(out.is_empty(), "not recorded unless asked");
    c.record_changes();
    // [1, 2] were released tail first: making room for three blocks evicts 2, which is then
    // computed again; the next chain's room evicts the least recent, 1 and then 4.
    cache_chain(&mut c, &[2, 3, 4]);
    cache_chain(&mut c, &[5, 6]);
    c.take_changes(&mut out);
    use CacheChange::{Evicted, Stored};
    assert_eq!(
        out,
        vec![
            Evicted(2),
            Stored(2),
            Stored(3),
            Stored(4),
            Evicted(1),
            Evicted(4),
            Stored(5),
            Stored(6)
        ]
    );
    out.clear();
    c.take_changes(&mut out);
    assert!(out.is_empty(), "taken once");
    // A block already cached is not stored twice (the room for it evicts the least recent).
    assert!(c.allocate(1));
    assert_eq!(c.commit(5), None);
    c.free_private(1);
    c.take_changes(&mut out);
    assert_eq!(out, vec![Evicted(3)]);
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
