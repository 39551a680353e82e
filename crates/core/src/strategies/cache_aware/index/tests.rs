//! The index's tests: the walk against a block-by-block one, the LRU order against a model,
//! the touch's report against the separate walks it replaced, budgets and residency.

use super::*;
use proptest::prelude::*;

/// The separate walks [`BlockIndex::touch`]'s report replaced: the reference it is checked
/// against.
impl BlockIndex {
    /// The stamp `slot` has on block `hash`, if it is listed as a holder.
    pub fn stamp(&self, hash: u64, slot: usize) -> Option<u32> {
        let tag = slot as u16 + 1;
        let e = self.lookup(hash)?;
        self.entries[e as usize]
            .holders
            .iter()
            .find(|x| x.slot == tag)
            .map(|x| x.stamp)
    }

    /// How far past block `from` the index has `chain` stamped for `slot` (since it was last
    /// forgotten, resident or not), and the largest distance of those stamps: what the engine
    /// must have kept for it still to hold them all. The reference [`BlockIndex::touch`]'s
    /// report is checked against.
    pub fn stamped_from(
        &self,
        chain: &[u64],
        from: usize,
        slot: usize,
        slots: &Slots,
    ) -> (u32, u32) {
        let mut blocks = 0u32;
        let mut oldest = 0u32;
        for h in chain.iter().skip(from) {
            match self.stamp(*h, slot).filter(|&s| slots.known(slot, s)) {
                Some(stamp) => {
                    blocks += 1;
                    oldest = oldest.max(slots.distance(slot, stamp));
                }
                None => break,
            }
        }
        (blocks, oldest)
    }
}

fn slots(n: usize) -> Slots {
    let mut s = Slots::default();
    s.ensure(n - 1, u32::MAX);
    s
}

#[test]
fn bytes_stay_fixed_once_full_however_much_churns_through() {
    let mut ix = BlockIndex::new(5_000);
    let mut s = slots(4);
    let mut next = 0u64;
    let mut fill = |ix: &mut BlockIndex, s: &mut Slots, chains: usize| {
        for c in 0..chains {
            let chain: Vec<u64> = (next..next + 50).collect();
            next += 50;
            ix.touch(&chain, c % 4, s, 0);
        }
    };
    fill(&mut ix, &mut s, 100);
    assert_eq!(ix.len(), 5_000);
    let full = ix.bytes();
    // 40 B per entry and 2-4 table slots of 4 B per block.
    assert_eq!(std::mem::size_of::<Entry>(), 40);
    assert!(full <= 5_000 * 56 + 4096, "{full}");
    // Twenty times the budget evicted and replaced (a swiss table doubled here).
    fill(&mut ix, &mut s, 2_000);
    assert_eq!(ix.len(), 5_000);
    assert_eq!(ix.bytes(), full);
}

fn matches(ix: &BlockIndex, chain: &[u64], s: &Slots, n: usize) -> Vec<u32> {
    let mut m = vec![0; n];
    ix.longest_matches(chain, s, &mut m);
    m
}

#[test]
fn longest_match_per_instance() {
    let mut ix = BlockIndex::new(100);
    let mut s = slots(3);
    ix.touch(&[1, 2, 3, 4], 0, &mut s, 0);
    ix.touch(&[1, 2, 9], 1, &mut s, 0);
    assert_eq!(matches(&ix, &[1, 2, 3, 4, 5], &s, 3), vec![4, 2, 0]);
    assert_eq!(matches(&ix, &[1, 2, 9], &s, 3), vec![2, 3, 0]);
    assert_eq!(matches(&ix, &[7, 1], &s, 3), vec![0, 0, 0]);
    assert_eq!(s.counter, vec![4, 3, 0]);
    // Re-sending what it holds does not advance the counter.
    ix.touch(&[1, 2, 3], 0, &mut s, 0);
    assert_eq!(s.counter[0], 4);
}

#[test]
fn the_budget_evicts_the_least_recently_used_block() {
    let mut ix = BlockIndex::new(3);
    let mut s = slots(1);
    ix.touch(&[1, 2, 3], 0, &mut s, 0); // the tail, 3, is the least recent
    ix.touch(&[5], 0, &mut s, 0);
    assert_eq!(ix.len(), 3);
    assert_eq!(
        matches(&ix, &[1, 2, 3], &s, 1),
        vec![2],
        "the tail goes first"
    );
    assert_eq!(matches(&ix, &[5], &s, 1), vec![1]);
    ix.touch(&[1], 0, &mut s, 0); // now 2 is the least recent
    ix.touch(&[6], 0, &mut s, 0);
    assert_eq!(matches(&ix, &[1, 2], &s, 1), vec![1]);
    assert_eq!(matches(&ix, &[5], &s, 1), vec![1]);
}

#[test]
fn capacity_and_forgetting_hide_blocks_the_engine_evicted() {
    let mut ix = BlockIndex::new(100);
    let mut s = slots(2);
    ix.touch(&[1, 2], 0, &mut s, 0);
    ix.touch(&[1, 2], 1, &mut s, 0);
    s.capacity[0] = 3;
    // Distances of blocks 1 and 2 are now 2 and 3: an LRU cache of 3 blocks that loses each
    // chain's tail first holds 1, 10 and 11, so only the first block matches.
    ix.touch(&[10, 11], 0, &mut s, 0);
    assert_eq!(matches(&ix, &[1, 2], &s, 2), vec![1, 2]);
    s.capacity[0] = 4;
    assert_eq!(matches(&ix, &[1, 2], &s, 2), vec![2, 2]);
    s.forget(1);
    assert_eq!(matches(&ix, &[1, 2], &s, 2), vec![2, 0]);
    s.forget(1);
    assert_eq!(
        matches(&ix, &[1, 2], &s, 2),
        vec![2, 0],
        "a second forget keeps it gone"
    );
    ix.touch(&[1, 2], 1, &mut s, 0);
    s.forget(0);
    s.forget(0);
    assert_eq!(matches(&ix, &[1, 2], &s, 2), vec![0, 2]);
    ix.touch(&[1, 2], 0, &mut s, 0);
    assert_eq!(matches(&ix, &[1, 2], &s, 2), vec![2, 2]);
    s.capacity[0] = u32::MAX;
    ix.remove_holder(&[1], 0);
    assert_eq!(matches(&ix, &[1, 2], &s, 2), vec![0, 2]);
}

#[test]
fn a_busy_block_keeps_its_most_recent_holders() {
    let mut ix = BlockIndex::new(10);
    let n = HOLDERS + 2;
    let mut s = slots(n);
    for slot in 0..n {
        ix.touch(&[42], slot, &mut s, 0);
        // Age the others: each instance caches some other blocks.
        for other in 0..n {
            if other != slot {
                ix.touch(&[1000 + other as u64 * 100 + slot as u64], other, &mut s, 0);
            }
        }
    }
    let m = matches(&ix, &[42], &s, n);
    assert_eq!(m.iter().sum::<u32>(), HOLDERS as u32);
    assert_eq!(m[n - 1], 1, "the latest holder is kept");
}

/// The walk before galloping, block by block: the reference the gallop must agree with.
fn linear_matches(ix: &BlockIndex, chain: &[u64], slots: &Slots, matched: &mut [u32]) {
    let mut crowd_from: Option<u32> = None;
    for (i, h) in chain.iter().enumerate() {
        let Some(e) = ix.lookup(*h) else {
            return;
        };
        let i = i as u32;
        let entry = &ix.entries[e as usize];
        let crowded = ix.is_crowded(e);
        let reached = |m: u32| m == i || crowd_from.is_some_and(|from| m >= from);
        let mut advanced = false;
        for holder in entry.holders.iter().filter(|h| h.slot != 0) {
            let slot = usize::from(holder.slot - 1);
            if let Some(m) = matched.get_mut(slot) {
                if reached(*m) && slots.resident(slot, holder.stamp) {
                    *m = i + 1;
                    advanced = true;
                }
            }
        }
        if crowded {
            crowd_from = crowd_from.or(Some(i));
        } else if !advanced {
            return;
        } else {
            crowd_from = None;
        }
    }
}

/// Block `b` of a chain over document `doc` behind a shared opening of `opening` blocks:
/// a block's hash stands for everything before it, as a real chain's does.
fn block(doc: u64, opening: usize, b: usize) -> u64 {
    if b < opening {
        b as u64
    } else {
        1_000 + doc * 1_000 + b as u64
    }
}

proptest! {
    /// Galloping gives the same matches as the block-by-block walk, under budget evictions,
    /// small caches, forgotten instances, crowded shared openings (more instances than
    /// holders) and chains that share prefixes of every length.
    #[test]
    fn galloping_agrees_with_the_block_by_block_walk(
        ops in proptest::collection::vec((0u64..6, 1usize..40, 0usize..7, 0u8..20), 1..150),
        opening in 0usize..6,
        budget in 8usize..400,
        caps in proptest::collection::vec(4u32..300, 7),
    ) {
        let mut ix = BlockIndex::new(budget);
        let mut s = slots(7);
        s.capacity = caps;
        for (doc, len, slot, action) in ops {
            let chain: Vec<u64> = (0..len).map(|b| block(doc, opening, b)).collect();
            if action == 0 {
                s.forget(slot);
            } else {
                ix.touch(&chain, slot, &mut s, 0);
            }
            // Probe every document at full length, and this one cut short.
            for probe_doc in 0..6 {
                let probe: Vec<u64> = (0..45).map(|b| block(probe_doc, opening, b)).collect();
                let mut fast = vec![0; 7];
                let mut slow = vec![0; 7];
                ix.longest_matches(&probe, &s, &mut fast);
                linear_matches(&ix, &probe, &s, &mut slow);
                prop_assert_eq!(fast, slow, "doc {}", probe_doc);
            }
            // This one at its own length, cut short, and with a few blocks more (which other
            // touches of the document may have sent): the walk's shortcut for the slots holding
            // the deepest of the last blocks is taken.
            let longer: Vec<u64> = (0..len + 1 + len % 4).map(|b| block(doc, opening, b)).collect();
            for probe in [&chain[..], &chain[..len / 2], &longer[..]] {
                let mut fast = vec![0; 7];
                let mut slow = vec![0; 7];
                ix.longest_matches(probe, &s, &mut fast);
                linear_matches(&ix, probe, &s, &mut slow);
                prop_assert_eq!(fast, slow, "{} of {} blocks", probe.len(), len);
            }
        }
    }
}

proptest! {
    /// What `touch` reports having had before equals the separate walks it replaced
    /// (`stamp` of the deepest predicted block, `stamped_from` past it), under forgotten
    /// instances, small caches, shared openings and predictions past the chain's end. The
    /// budget holds every block: a touch that evicts its own chain's older blocks before
    /// reaching them (an index smaller than its traffic's working set) reports them missing.
    #[test]
    fn touch_reports_what_the_index_had(
        ops in proptest::collection::vec((0u64..6, 1usize..40, 0usize..5, 0u8..20, 0usize..45), 1..120),
        opening in 0usize..6,
        caps in proptest::collection::vec(4u32..300, 5),
    ) {
        let mut ix = BlockIndex::new(1 << 12);
        let mut s = slots(5);
        s.capacity = caps;
        for (doc, len, slot, action, from) in ops {
            let chain: Vec<u64> = (0..len).map(|b| block(doc, opening, b)).collect();
            if action == 0 {
                s.forget(slot);
                continue;
            }
            let last = from.checked_sub(1).and_then(|b| chain.get(b));
            let want_last = last.and_then(|h| ix.stamp(*h, slot));
            let (beyond, beyond_distance) = ix.stamped_from(&chain, from, slot, &s);
            let got = ix.touch(&chain, slot, &mut s, from);
            prop_assert_eq!(got, Before { last_predicted: want_last, beyond, beyond_distance });
        }
    }
}

/// The LRU list head to tail, checked against its backward links.
fn list(ix: &BlockIndex) -> Vec<u64> {
    let mut order = Vec::new();
    let mut at = ix.head;
    let mut prev = NIL;
    while at != NIL {
        let e = &ix.entries[at as usize];
        assert_eq!(e.prev, prev, "backward link of {}", e.hash);
        order.push(e.hash);
        prev = at;
        at = e.next;
    }
    assert_eq!(ix.tail, prev);
    order
}

proptest! {
    /// The list order after each touch is the one a block-by-block LRU gives (each block,
    /// last first, moved or added to the front; the least recent dropped when full), though
    /// chains already on the list in order move as whole runs. Chains share openings, are
    /// cut short, and repeat a block (a hash collision) now and then.
    #[test]
    fn runs_move_as_a_block_by_block_lru_would(
        ops in proptest::collection::vec((0u64..8, 1usize..30, 0usize..3, any::<bool>()), 1..120),
        opening in 0usize..5,
        budget in 4usize..200,
    ) {
        let mut ix = BlockIndex::new(budget);
        let mut s = slots(3);
        let mut model: std::collections::VecDeque<u64> = Default::default();
        for (doc, len, slot, repeat) in ops {
            let mut chain: Vec<u64> = (0..len).map(|b| block(doc, opening, b)).collect();
            if repeat && len > 2 {
                chain[len / 2] = chain[len / 2 - 1];
            }
            ix.touch(&chain, slot, &mut s, 0);
            for &h in chain.iter().rev() {
                if let Some(at) = model.iter().position(|&x| x == h) {
                    model.remove(at);
                } else if model.len() >= budget {
                    model.pop_back();
                }
                model.push_front(h);
            }
            prop_assert_eq!(list(&ix), Vec::from(model.clone()));
        }
    }
}

proptest! {
    #[test]
    fn never_exceeds_the_budget_and_lists_stay_consistent(
        ops in proptest::collection::vec((0u64..50, 1usize..6, 0usize..4), 1..200),
        budget in 1usize..40,
    ) {
        let mut ix = BlockIndex::new(budget);
        let mut s = slots(4);
        for (start, len, slot) in ops {
            let chain: Vec<u64> = (start..start + len as u64).collect();
            ix.touch(&chain, slot, &mut s, 0);
            prop_assert!(ix.len() <= budget);
            // Walk the LRU list: it holds exactly the table's entries.
            let mut n = 0;
            let mut at = ix.head;
            while at != NIL {
                let e = &ix.entries[at as usize];
                prop_assert_eq!(ix.lookup(e.hash), Some(at));
                n += 1;
                at = e.next;
            }
            prop_assert_eq!(n, ix.len());
            // The most recent chain's last block is always matched on its slot... when it fits.
            if len <= budget {
                let mut m = vec![0; 4];
                ix.longest_matches(&chain, &s, &mut m);
                prop_assert_eq!(m[slot] as usize, len);
            }
        }
    }
}

proptest! {
    /// Stamps and counters after each touch equal a per-block model's: walking the chain last
    /// block first, a block the instance does not (probably) hold advances its counter, and
    /// every block takes the counter as its stamp. Repeat touches of a chain take the touch's
    /// run-extending shortcut; small caches and forgotten instances send blocks down the
    /// general path in the middle of a run. Four instances at most, so every holder is listed
    /// (nothing crowded), and a budget that keeps every block.
    #[test]
    fn stamps_and_counters_follow_a_block_by_block_model(
        ops in proptest::collection::vec((0u64..6, 1usize..40, 0usize..HOLDERS, 0u8..12), 1..150),
        opening in 0usize..6,
        caps in proptest::collection::vec(4u32..200, HOLDERS),
    ) {
        let mut ix = BlockIndex::new(1 << 12);
        let mut s = slots(HOLDERS);
        s.capacity = caps.clone();
        let mut stamps: std::collections::HashMap<(u64, usize), u32> = Default::default();
        let mut counter = [0u32; HOLDERS];
        let mut forgotten = [0u32; HOLDERS];
        for (doc, len, slot, action) in ops {
            let chain: Vec<u64> = (0..len).map(|b| block(doc, opening, b)).collect();
            if action == 0 {
                s.forget(slot);
                forgotten[slot] = counter[slot];
                continue;
            }
            ix.touch(&chain, slot, &mut s, 0);
            for &h in chain.iter().rev() {
                let resident = stamps.get(&(h, slot)).is_some_and(|&st| {
                    let d = counter[slot].wrapping_sub(st);
                    d < caps[slot] && d < counter[slot].wrapping_sub(forgotten[slot])
                });
                if !resident {
                    counter[slot] = counter[slot].wrapping_add(1);
                }
                stamps.insert((h, slot), counter[slot]);
            }
            prop_assert_eq!(&s.counter, &counter.to_vec());
            for (&(h, sl), &st) in &stamps {
                prop_assert_eq!(ix.stamp(h, sl), Some(st), "block {} on {}", h, sl);
            }
        }
    }
}
