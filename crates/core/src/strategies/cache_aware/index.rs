//! The block index: block-chain hash → the instances recently sent that block.
//!
//! One global budget of tracked blocks for the whole fleet (memory never grows with fleet size
//! or traffic): entries live in a slab threaded on an LRU list, and the least recently touched
//! block is forgotten when the budget is full. Each entry names up to [`HOLDERS`] instances,
//! each with a stamp: the instance's insertion counter when the block was last sent there.
//!
//! Residency follows the engine's own LRU instead of a wall-clock horizon: every block newly
//! sent to an instance advances that instance's counter by one, so `counter - stamp` is how many
//! blocks the engine has had to cache since this one was last used. Once that exceeds the
//! instance's estimated capacity ([`Slots`]), the engine has most likely evicted it. Forgetting
//! an instance (ejected, removed) records its counter: every stamp up to it looks evicted,
//! however often it is forgotten, without walking the index.
//!
//! Bytes per tracked block: one [`Entry`] (48 B) plus 2-4 slots of the [table](super::table)
//! (4 B each: a power of two of at least twice the budget, fixed at creation), so 56 B at the
//! default budget of 1 Mi blocks: 56 MiB once full, and never more. See [`BlockIndex::bytes`].

use super::table::BlockTable;

/// Instances tracked per block. A block held by more instances keeps the most recent ones.
pub const HOLDERS: usize = 4;

const NIL: u32 = u32::MAX;

/// One holder: instance slot + 1 (0 = empty) and its stamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holder {
    slot: u16,
    stamp: u32,
}

#[derive(Debug, Clone)]
struct Entry {
    hash: u64,
    prev: u32,
    next: u32,
    holders: [Holder; HOLDERS],
}

/// Per-instance insertion counters and residency estimates, indexed by slot.
#[derive(Debug, Default, Clone)]
pub struct Slots {
    /// Blocks newly sent to the instance so far (wrapping).
    pub counter: Vec<u32>,
    /// Blocks the instance's cache is estimated to hold (`u32::MAX`: not known yet).
    pub capacity: Vec<u32>,
    /// The counter when the instance was last forgotten: stamps from before it are gone.
    pub forgotten_at: Vec<u32>,
}

impl Slots {
    /// Makes room for `slot`, with `capacity` as its starting estimate.
    pub fn ensure(&mut self, slot: usize, capacity: u32) {
        while self.counter.len() <= slot {
            self.counter.push(0);
            self.capacity.push(capacity);
            self.forgotten_at.push(0);
        }
    }
    /// How many blocks the instance cached since `stamp`.
    pub fn distance(&self, slot: usize, stamp: u32) -> u32 {
        self.counter
            .get(slot)
            .map_or(u32::MAX, |c| c.wrapping_sub(stamp))
    }
    /// Whether a block stamped at `stamp` was sent since the instance was last forgotten
    /// (resident or not).
    pub fn known(&self, slot: usize, stamp: u32) -> bool {
        self.distance(slot, stamp)
            < self.distance(slot, self.forgotten_at.get(slot).copied().unwrap_or(0))
    }
    fn resident(&self, slot: usize, stamp: u32) -> bool {
        let cap = self.capacity.get(slot).copied().unwrap_or(0);
        self.distance(slot, stamp) < cap && self.known(slot, stamp)
    }
    /// Blocks the instance probably holds: those sent since it was last forgotten, at most its
    /// estimated capacity.
    pub fn footprint(&self, slot: usize) -> u32 {
        let since = self.distance(slot, self.forgotten_at.get(slot).copied().unwrap_or(0));
        since.min(self.capacity.get(slot).copied().unwrap_or(0))
    }
    /// Makes every block the instance was sent look evicted (it lost or may have lost its cache).
    pub fn forget(&mut self, slot: usize) {
        if let (Some(c), Some(f)) = (self.counter.get_mut(slot), self.forgotten_at.get_mut(slot)) {
            // Every block sent from now on gets a newer stamp than this.
            *f = *c;
        }
    }
}

/// What the index had for an instance before [`BlockIndex::touch`] sent it a chain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Before {
    /// The stamp of the last block a decision predicted cached (block `from - 1`), if listed.
    pub last_predicted: Option<u32>,
    /// How many blocks from `from` on were stamped since the instance was last forgotten
    /// (resident or not), in a row.
    pub beyond: u32,
    /// The largest distance of those stamps: what the engine must have kept for it still to
    /// hold them all.
    pub beyond_distance: u32,
}

/// The index.
#[derive(Debug, Clone)]
pub struct BlockIndex {
    table: BlockTable,
    entries: Vec<Entry>,
    head: u32,
    tail: u32,
    budget: usize,
    /// One bit per entry: the block was sent to more instances than it lists, and a listed
    /// one that still held it was displaced. The walk then lets every instance that reached it
    /// through it (see [`BlockIndex::longest_matches`]).
    crowded: Vec<u64>,
}

impl BlockIndex {
    /// An empty index that tracks at most `budget` blocks (at least 1).
    pub fn new(budget: usize) -> Self {
        let budget = budget.max(1);
        Self {
            table: BlockTable::new(budget),
            entries: Vec::new(),
            head: NIL,
            tail: NIL,
            budget,
            crowded: Vec::new(),
        }
    }

    /// Blocks tracked.
    pub fn len(&self) -> usize {
        self.table.len()
    }
    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
    /// The budget in blocks.
    pub fn budget(&self) -> usize {
        self.budget
    }
    /// Bytes held by entries and table (capacity, not just use).
    pub fn bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.table.bytes()
            + self.crowded.capacity() * 8
    }

    /// The entry of block `hash`.
    fn lookup(&self, hash: u64) -> Option<u32> {
        self.table.get(hash, |e| self.entries[e as usize].hash)
    }

    fn is_crowded(&self, e: u32) -> bool {
        self.crowded
            .get(e as usize / 64)
            .is_some_and(|w| w & (1 << (e % 64)) != 0)
    }
    fn set_crowded(&mut self, e: u32, on: bool) {
        let word = e as usize / 64;
        if self.crowded.len() <= word {
            self.crowded.resize(word + 1, 0);
        }
        if on {
            self.crowded[word] |= 1 << (e % 64);
        } else {
            self.crowded[word] &= !(1 << (e % 64));
        }
    }

    /// For each block of `chain` in order, the slots that still (probably) hold it and held every
    /// block before it: `matched[slot]` is set to the number of leading blocks that slot holds.
    /// `matched` must be zeroed for the slots of interest and long enough for every slot.
    ///
    /// A crowded block (more holders than it lists: a shared opening on a large fleet) lets
    /// through every slot that reached it, unlisted or not, without counting for them: a slot
    /// listed on a later block is taken to hold the crowded ones before it (that later block's
    /// hash covers them, and an engine keeps a prefix's head longer than its tail), and one that
    /// is not keeps the match it had before them.
    ///
    /// Cost: O(log(matched blocks) x [`HOLDERS`]) lookups for each change in the set of slots
    /// still matching, plus one per crowded block. A match is monotone along a chain: [`touch`]
    /// stamps a chain tail first, so for any slot a block is never more recent than the blocks
    /// before it (every chain holding a block holds its prefix too), the budget evicts a tail
    /// before its head, and residency is a bound on a stamp's age. So once a slot holds block
    /// `j`, it holds every block up to `j`, and the walk gallops: it probes blocks 1, 2, 4, ...
    /// past the last step while the same slots hold them, then bisects the gap, and steps one
    /// block at a time only where a slot drops out or blocks are crowded. Each lookup is likely
    /// a cache miss in a large index; a 64 KiB prompt is 512 of them walked block by block.
    /// `tests::galloping_agrees_with_the_block_by_block_walk` checks it against that walk.
    ///
    /// [`touch`]: BlockIndex::touch
    pub fn longest_matches(&self, chain: &[u64], slots: &Slots, matched: &mut [u32]) {
        // Where the current run of crowded blocks started.
        let mut crowd_from: Option<u32> = None;
        let mut i = 0usize;
        // After a crowded block, the next one's likely entry: its successor on the LRU list,
        // where a chain touched as a whole lies in order (checked by its hash; a shared opening
        // sent to many instances is walked block by block, each otherwise a table probe).
        let mut hint = NIL;
        while i < chain.len() {
            let found = if hint != NIL && self.entries[hint as usize].hash == chain[i] {
                Some(hint)
            } else {
                self.lookup(chain[i])
            };
            let Some(e) = found else {
                return;
            };
            let at = i as u32;
            let entry = &self.entries[e as usize];
            let crowded = self.is_crowded(e);
            let reached = |m: u32| m == at || crowd_from.is_some_and(|from| m >= from);
            // The slots that advanced here (at most one per holder).
            let mut went = [usize::MAX; HOLDERS];
            let mut advanced = false;
            for (k, holder) in entry.holders.iter().enumerate() {
                if holder.slot == 0 {
                    continue;
                }
                let slot = usize::from(holder.slot - 1);
                if let Some(m) = matched.get_mut(slot) {
                    if reached(*m) && slots.resident(slot, holder.stamp) {
                        *m = at + 1;
                        went[k] = slot;
                        advanced = true;
                    }
                }
            }
            if crowded {
                crowd_from = crowd_from.or(Some(at));
                hint = entry.next;
                i += 1;
                continue;
            }
            hint = NIL;
            if !advanced {
                return;
            }
            crowd_from = None;
            // Gallop past `i` while every slot that advanced here holds the block and it is not
            // crowded; `last` is the furthest block known to pass.
            let holds = |j: usize| self.held_by_all(chain[j], &went, slots);
            let mut last = i;
            let mut step = 1usize;
            let mut fail = chain.len();
            while last + step < chain.len() {
                if holds(last + step) {
                    last += step;
                    step *= 2;
                } else {
                    fail = last + step;
                    break;
                }
            }
            // Bisect between the last block that passed and the first that failed.
            while fail - last > 1 {
                let mid = last + (fail - last) / 2;
                if holds(mid) {
                    last = mid;
                } else {
                    fail = mid;
                }
            }
            for &slot in went.iter().filter(|&&s| s != usize::MAX) {
                matched[slot] = last as u32 + 1;
            }
            // The next block is where one of them stops or a crowded run begins: one step.
            i = last + 1;
        }
    }

    /// Whether block `hash` is tracked, not crowded, and each of `want` (slots; `usize::MAX`
    /// for none) is listed on it with a resident stamp.
    fn held_by_all(&self, hash: u64, want: &[usize; HOLDERS], slots: &Slots) -> bool {
        let Some(e) = self.lookup(hash) else {
            return false;
        };
        if self.is_crowded(e) {
            return false;
        }
        let holders = &self.entries[e as usize].holders;
        want.iter().filter(|&&s| s != usize::MAX).all(|&slot| {
            holders
                .iter()
                .any(|h| usize::from(h.slot) == slot + 1 && slots.resident(slot, h.stamp))
        })
    }

    /// Records that every block of `chain` was sent to `slot` now: each becomes the most recently
    /// used (the head most of all), and blocks the instance did not (probably) hold advance its
    /// counter. Returns what the index had for `slot` before, past block `from` (the blocks a
    /// decision predicted cached): read in the same pass, so a decision looks each block up
    /// once.
    pub fn touch(&mut self, chain: &[u64], slot: usize, slots: &mut Slots, from: usize) -> Before {
        let tag = slot as u16 + 1;
        // A slot never made room for holds nothing (capacity 0).
        slots.ensure(slot, 0);
        // Only this slot's counter moves during the pass: its values are read once.
        let (cap, forgotten, start) = (
            slots.capacity[slot],
            slots.forgotten_at[slot],
            slots.counter[slot],
        );
        let mut counter = start;
        let mut before = Before::default();
        // Chain blocks already in place, not yet moved to the LRU front: a run of the list, its
        // first and last entries. A chain sent before lies on the list as one run (or a few,
        // where it shares blocks with others), so it moves as a few splices instead of an unlink
        // and relink per block, each in random memory on a large index.
        let mut run: Option<(u32, u32)> = None;
        // The list predecessor of the block just visited: in a chain sent before, most likely
        // this block's entry (checked by its hash), found without probing the table (a random
        // read) and with the entry it is read from already needed.
        let mut hint = NIL;
        // Last block first: the chain's head ends up the most recently used, both on the LRU
        // list and in the stamps, so the index (and its picture of the engine, whose LRU frees
        // a request's blocks tail first, as vLLM does) loses a prefix's tail before its head;
        // otherwise a long prompt's first blocks would be forgotten while its later ones, now
        // unreachable by a walk from the start, stayed.
        for (i, &h) in chain.iter().enumerate().rev() {
            let found = if hint != NIL && self.entries[hint as usize].hash == h {
                Some(hint)
            } else {
                self.lookup(h)
            };
            let e = match found {
                // Just before the run on the list: it joins it.
                Some(e) if run.is_some_and(|(first, _)| self.entries[e as usize].next == first) => {
                    run = run.map(|(_, last)| (e, last));
                    e
                }
                Some(e) => {
                    self.splice_front(run);
                    run = Some((e, e));
                    e
                }
                None => {
                    // What was visited goes to the front first: the budget evicts from the tail.
                    self.splice_front(run.take());
                    let e = self.insert(h);
                    self.push_front(e);
                    e
                }
            };
            let crowded = self.is_crowded(e);
            let entry = &mut self.entries[e as usize];
            let listed = entry.holders.iter().position(|x| x.slot == tag);
            let then = listed.map(|p| entry.holders[p].stamp);
            // What was there before, measured at the counter before this touch. Walking back,
            // a block without a known stamp restarts the run that ends at `from`.
            if i + 1 == from {
                before.last_predicted = then;
            } else if i >= from {
                match then.filter(|&s| start.wrapping_sub(s) < start.wrapping_sub(forgotten)) {
                    Some(s) => {
                        before.beyond += 1;
                        before.beyond_distance = before.beyond_distance.max(start.wrapping_sub(s));
                    }
                    None => (before.beyond, before.beyond_distance) = (0, 0),
                }
            }
            // Resident (see `Slots::resident`); an unlisted instance sent a crowded block most
            // likely holds it already.
            let had = then.map_or(crowded, |s| {
                let d = counter.wrapping_sub(s);
                d < cap && d < counter.wrapping_sub(forgotten)
            });
            if !had {
                counter = counter.wrapping_add(1);
            }
            let at = listed
                .or_else(|| entry.holders.iter().position(|x| x.slot == 0))
                .unwrap_or_else(|| oldest(&entry.holders, slots));
            let displaced = entry.holders[at];
            entry.holders[at] = Holder {
                slot: tag,
                stamp: counter,
            };
            // Other instances' counters do not move here: `slots` still holds theirs.
            if displaced.slot != 0
                && displaced.slot != tag
                && slots.resident(usize::from(displaced.slot - 1), displaced.stamp)
            {
                self.set_crowded(e, true);
            }
            hint = self.entries[e as usize].prev;
        }
        self.splice_front(run);
        slots.counter[slot] = counter;
        before
    }

    /// Whether block `hash` is listed at all (sent to some instance and not yet dropped from
    /// the budget, resident there or not).
    pub fn contains(&self, hash: u64) -> bool {
        self.lookup(hash).is_some()
    }

    /// The stamp `slot` has on block `hash`, if it is listed as a holder.
    #[cfg(test)]
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
    #[cfg(test)]
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

    /// Drops `slot` from every block of `chain` (the engine said it does not hold them).
    pub fn remove_holder(&mut self, chain: &[u64], slot: usize) {
        let tag = slot as u16 + 1;
        for h in chain {
            if let Some(e) = self.lookup(*h) {
                for x in self.entries[e as usize].holders.iter_mut() {
                    if x.slot == tag {
                        *x = Holder::default();
                    }
                }
            }
        }
    }

    fn insert(&mut self, hash: u64) -> u32 {
        // Full: the least recently used entry is forgotten and its place reused.
        let mut reuse = None;
        if self.table.len() >= self.budget && self.tail != NIL {
            let victim = self.tail;
            self.unlink(victim);
            let old = self.entries[victim as usize].hash;
            let entries = &self.entries;
            self.table.remove(old, |e| entries[e as usize].hash);
            reuse = Some(victim);
        }
        let entry = Entry {
            hash,
            prev: NIL,
            next: NIL,
            holders: [Holder::default(); HOLDERS],
        };
        let e = match reuse {
            Some(e) => {
                self.entries[e as usize] = entry;
                e
            }
            None => {
                // Grow in steps that never pass the budget (doubling would reserve up to twice).
                if self.entries.len() == self.entries.capacity() {
                    let room = self.budget.saturating_sub(self.entries.len());
                    self.entries.reserve_exact(
                        self.entries
                            .capacity()
                            .clamp(1024, 1 << 20)
                            .min(room.max(1)),
                    );
                }
                self.entries.push(entry);
                (self.entries.len() - 1) as u32
            }
        };
        self.table.insert(hash, e);
        self.set_crowded(e, false);
        e
    }

    fn unlink(&mut self, e: u32) {
        let (prev, next) = {
            let x = &self.entries[e as usize];
            (x.prev, x.next)
        };
        if prev != NIL {
            self.entries[prev as usize].next = next;
        } else if self.head == e {
            self.head = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else if self.tail == e {
            self.tail = prev;
        }
        let x = &mut self.entries[e as usize];
        x.prev = NIL;
        x.next = NIL;
    }

    /// Moves the list's run from `first` to `last` (linked in that order) to the front.
    fn splice_front(&mut self, run: Option<(u32, u32)>) {
        let Some((first, last)) = run else {
            return;
        };
        if self.head == first {
            return;
        }
        let (prev, next) = (
            self.entries[first as usize].prev,
            self.entries[last as usize].next,
        );
        // Not the head, so it has a predecessor.
        self.entries[prev as usize].next = next;
        if next != NIL {
            self.entries[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
        self.entries[last as usize].next = self.head;
        let old = self.head;
        self.entries[old as usize].prev = last;
        self.entries[first as usize].prev = NIL;
        self.head = first;
    }

    fn push_front(&mut self, e: u32) {
        let old = self.head;
        {
            let x = &mut self.entries[e as usize];
            x.prev = NIL;
            x.next = old;
        }
        if old != NIL {
            self.entries[old as usize].prev = e;
        }
        self.head = e;
        if self.tail == NIL {
            self.tail = e;
        }
    }
}

/// The holder to replace when all are taken: the one its instance cached longest ago.
fn oldest(holders: &[Holder; HOLDERS], slots: &Slots) -> usize {
    let mut best = 0;
    let mut far = 0u32;
    for (i, h) in holders.iter().enumerate() {
        let d = slots.distance(usize::from(h.slot.saturating_sub(1)), h.stamp);
        if d >= far {
            far = d;
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        // 48 B per entry and 2-4 table slots of 4 B per block.
        assert!(full <= 5_000 * 64 + 4096, "{full}");
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
                let cut = &chain[..len / 2];
                let mut fast = vec![0; 7];
                let mut slow = vec![0; 7];
                ix.longest_matches(cut, &s, &mut fast);
                linear_matches(&ix, cut, &s, &mut slow);
                prop_assert_eq!(fast, slow);
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
}
