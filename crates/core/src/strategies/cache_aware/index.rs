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
//! Bytes per tracked block: one [`Entry`] (40 B) plus 2-4 slots of the [table](super::table)
//! (4 B each: a power of two of at least twice the budget, fixed at creation), so 48 B at the
//! default budget of 1 Mi blocks: 48 MiB once full, and never more. See [`BlockIndex::bytes`].

use super::table::BlockTable;

/// Instances tracked per block. A block held by more instances keeps the most recent ones.
pub const HOLDERS: usize = 4;

const NIL: u32 = u32::MAX;

/// How many of a chain's last blocks [`BlockIndex::longest_matches`] looks at first: a prompt
/// sent before often comes back with a little new after it (a document with a short question),
/// up to 3 blocks (384 characters at the default block) nobody was sent. More new text than
/// that (a conversation's next turn, with the reply and the next message) is left to the
/// gallop.
const TAIL_PROBES: usize = 4;

/// One holder: instance slot + 1 (0 = empty) and its stamp.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holder {
    slot: u16,
    stamp: u32,
}

/// The holders of a block, as two arrays: an array of `Holder`s pads each to 8 bytes, which
/// made an entry 48 bytes instead of 40 (a sixth of the index's memory, and of what a touch
/// walks through).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Holders {
    slot: [u16; HOLDERS],
    stamp: [u32; HOLDERS],
}

impl Holders {
    /// The holder in place `k` (`k < HOLDERS`).
    #[inline]
    fn get(&self, k: usize) -> Holder {
        Holder {
            slot: self.slot[k],
            stamp: self.stamp[k],
        }
    }
    #[inline]
    fn set(&mut self, k: usize, h: Holder) {
        self.slot[k] = h.slot;
        self.stamp[k] = h.stamp;
    }
    /// Each place's holder, in order (empty places included).
    #[inline]
    fn iter(&self) -> impl Iterator<Item = Holder> + '_ {
        (0..HOLDERS).map(|k| self.get(k))
    }
    /// The place that lists `tag` (instance slot + 1; 0 finds an empty place).
    #[inline]
    fn position(&self, tag: u16) -> Option<usize> {
        self.slot.iter().position(|&x| x == tag)
    }
}

#[derive(Debug, Clone)]
struct Entry {
    hash: u64,
    prev: u32,
    next: u32,
    holders: Holders,
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
    /// One instance's counter, capacity and forgotten mark (`None`: no room made for it).
    #[inline]
    fn view(&self, slot: usize) -> Option<SlotView> {
        Some(SlotView {
            counter: *self.counter.get(slot)?,
            capacity: *self.capacity.get(slot)?,
            forgotten_at: *self.forgotten_at.get(slot)?,
        })
    }
    /// How many blocks the instance cached since `stamp`.
    pub fn distance(&self, slot: usize, stamp: u32) -> u32 {
        self.view(slot).map_or(u32::MAX, |v| v.distance(stamp))
    }
    /// Whether a block stamped at `stamp` was sent since the instance was last forgotten
    /// (resident or not).
    pub fn known(&self, slot: usize, stamp: u32) -> bool {
        self.view(slot).is_some_and(|v| v.known(stamp))
    }
    fn resident(&self, slot: usize, stamp: u32) -> bool {
        self.view(slot).is_some_and(|v| v.resident(stamp))
    }
    /// Blocks the instance probably holds: those sent since it was last forgotten, at most its
    /// estimated capacity.
    pub fn footprint(&self, slot: usize) -> u32 {
        self.view(slot)
            .map_or(0, |v| v.distance(v.forgotten_at).min(v.capacity))
    }
    /// Makes every block the instance was sent look evicted (it lost or may have lost its cache).
    pub fn forget(&mut self, slot: usize) {
        if let (Some(c), Some(f)) = (self.counter.get_mut(slot), self.forgotten_at.get_mut(slot)) {
            // Every block sent from now on gets a newer stamp than this.
            *f = *c;
        }
    }
}

/// One instance's residency values, copied out of [`Slots`] (a touch moves its counter
/// locally and writes it back once).
#[derive(Debug, Clone, Copy)]
struct SlotView {
    counter: u32,
    capacity: u32,
    forgotten_at: u32,
}

impl SlotView {
    fn distance(self, stamp: u32) -> u32 {
        self.counter.wrapping_sub(stamp)
    }
    /// Stamped since the instance was last forgotten.
    fn known(self, stamp: u32) -> bool {
        self.distance(stamp) < self.distance(self.forgotten_at)
    }
    /// Known and within the estimated capacity.
    fn resident(self, stamp: u32) -> bool {
        self.distance(stamp) < self.capacity && self.known(stamp)
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

impl Before {
    /// Notes block `i`'s stamp from before the touch, if listed (`then`), against the instance
    /// as it was then (`start`). The touch walks back, so a block without a stamp since the
    /// instance was last forgotten restarts the run that ends at `from`.
    fn note(&mut self, i: usize, from: usize, then: Option<u32>, start: SlotView) {
        if i + 1 == from {
            self.last_predicted = then;
        } else if i >= from {
            match then.filter(|&s| start.known(s)) {
                Some(s) => {
                    self.beyond += 1;
                    self.beyond_distance = self.beyond_distance.max(start.distance(s));
                }
                None => (self.beyond, self.beyond_distance) = (0, 0),
            }
        }
    }
}

/// Where a touch is on the LRU list.
#[derive(Debug)]
struct ListWalk {
    /// Chain blocks already in place, not yet moved to the front: a run of the list, its first
    /// and last entries. A chain sent before lies on the list as one run (or a few, where it
    /// shares blocks with others), so it moves as a few splices instead of an unlink and
    /// relink per block, each in random memory on a large index.
    run: Option<(u32, u32)>,
    /// The list predecessor of the block just visited: in a chain sent before, most likely the
    /// next block's entry (checked by its hash), found without probing the table (a random
    /// read) and with the entry it is read from already needed.
    hint: u32,
}

impl Default for ListWalk {
    fn default() -> Self {
        Self {
            run: None,
            hint: NIL,
        }
    }
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

    /// The entry of block `hash`: `hint` (an entry, or [`NIL`]) when it holds that block, else
    /// the table's. An entry on the list is the table's entry for its hash, so a matching hint
    /// is the answer without probing the table.
    fn lookup_near(&self, hash: u64, hint: u32) -> Option<u32> {
        if hint != NIL && self.entries[hint as usize].hash == hash {
            Some(hint)
        } else {
            self.lookup(hash)
        }
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
    /// The same rule settles a prompt sent before in a few probes: a slot that holds the
    /// deepest of the chain's last [`TAIL_PROBES`] blocks that is tracked at all (not crowded)
    /// holds every block up to it and none after, so it is matched that far where the walk
    /// reaches it, and the gallop goes on only for the others. Without it, a 256 KiB prompt's
    /// revisit galloped over its 2,048 blocks in about 21 probes, each a table slot and an
    /// entry at random places: in `serve`, with the index out of the processor's caches, about
    /// 7 µs of its decision. Looked up once some slot holds the first block: a prompt nobody
    /// was sent costs no more than before, but a new one behind a shared opening pays up to
    /// [`TAIL_PROBES`] more table probes (that find nothing).
    ///
    /// Where the rule does not hold, the shortcut and the block-by-block walk can differ, as
    /// the gallop could for the blocks it skips: a slot's estimated capacity that grows (an
    /// engine reported more cached than predicted) can make an old stamp on a tail block
    /// resident again after the slot was displaced, unlisted, from a block before it. The
    /// shortcut then takes the slot to hold the whole prefix, which is what an engine whose
    /// cache frees a prefix's tail first does hold. (`simulate`'s decisions on every built-in
    /// workload and the Mooncake trace are the same with and without it.)
    ///
    /// [`touch`]: BlockIndex::touch
    pub fn longest_matches(&self, chain: &[u64], slots: &Slots, matched: &mut [u32]) {
        let slots_len = matched.len();
        let mut deepest: Option<(u32, [usize; HOLDERS])> = None;
        // Where the current run of crowded blocks started.
        let mut crowd_from: Option<u32> = None;
        let mut i = 0usize;
        // After a crowded block, the next one's likely entry: its successor on the LRU list,
        // where a chain touched as a whole lies in order (checked by its hash; a shared opening
        // sent to many instances is walked block by block, each otherwise a table probe).
        let mut hint = NIL;
        while i < chain.len() {
            let Some(e) = self.lookup_near(chain[i], hint) else {
                return;
            };
            let at = i as u32;
            let entry = &self.entries[e as usize];
            let crowded = self.is_crowded(e);
            let reached = |m: u32| m == at || crowd_from.is_some_and(|from| m >= from);
            // The slots that advanced here (at most one per holder).
            let mut went = [usize::MAX; HOLDERS];
            for (k, holder) in entry.holders.iter().enumerate() {
                if holder.slot == 0 {
                    continue;
                }
                let slot = usize::from(holder.slot - 1);
                if let Some(m) = matched.get_mut(slot) {
                    if reached(*m) && slots.resident(slot, holder.stamp) {
                        let (depth, deep) = *deepest
                            .get_or_insert_with(|| self.deepest_holders(chain, slots, slots_len));
                        if deep.contains(&slot) {
                            *m = depth;
                        } else {
                            *m = at + 1;
                            went[k] = slot;
                        }
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
            // Nobody else advanced here, so nobody else can further on (a slot that did not
            // reach a block that is not crowded has stopped).
            if went.iter().all(|&s| s == usize::MAX) {
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

    /// The deepest of the last [`TAIL_PROBES`] blocks of `chain` that is tracked (its index + 1;
    /// 0 when none is), and the slots (at most [`HOLDERS`]; `usize::MAX` for none) listed on it
    /// with a resident stamp, unless it is crowded: they hold the chain up to it, and nobody
    /// holds the blocks after it (see [`BlockIndex::longest_matches`]). Slots from `slots_len`
    /// on are left out.
    fn deepest_holders(
        &self,
        chain: &[u64],
        slots: &Slots,
        slots_len: usize,
    ) -> (u32, [usize; HOLDERS]) {
        let mut deep = [usize::MAX; HOLDERS];
        for j in (chain.len().saturating_sub(TAIL_PROBES)..chain.len()).rev() {
            let Some(e) = self.lookup(chain[j]) else {
                continue;
            };
            if !self.is_crowded(e) {
                for (k, h) in self.entries[e as usize].holders.iter().enumerate() {
                    let slot = usize::from(h.slot).wrapping_sub(1);
                    if h.slot != 0 && slot < slots_len && slots.resident(slot, h.stamp) {
                        deep[k] = slot;
                    }
                }
            }
            return (j as u32 + 1, deep);
        }
        (0, deep)
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
        let Some(start) = slots.view(slot) else {
            return Before::default();
        };
        let mut now = start;
        let mut before = Before::default();
        let mut walk = ListWalk::default();
        // Last block first: the chain's head ends up the most recently used, both on the LRU
        // list and in the stamps, so the index (and its picture of the engine, whose LRU frees
        // a request's blocks tail first, as vLLM does) loses a prefix's tail before its head;
        // otherwise a long prompt's first blocks would be forgotten while its later ones, now
        // unreachable by a walk from the start, stayed.
        let mut i = chain.len();
        loop {
            // Blocks before the deepest predicted one tell `before` nothing: those are walked
            // in a loop without the call (a block there cost 35 instructions with it).
            let split = from.saturating_sub(1).min(i);
            i = self.extend_run(chain, i, split, tag, now, &mut walk, |b, then| {
                before.note(b, from, Some(then), start);
            });
            if i == split {
                i = self.extend_run(chain, i, 0, tag, now, &mut walk, |_, _| {});
            }
            let Some(b) = i.checked_sub(1) else {
                break;
            };
            i = b;
            let h = chain[i];
            let e = self.visit(h, &mut walk);
            let crowded = self.is_crowded(e);
            let holders = &self.entries[e as usize].holders;
            let listed = holders.position(tag);
            let then = listed.map(|p| holders.stamp[p]);
            before.note(i, from, then, start);
            // An unlisted instance sent a crowded block most likely holds it already.
            if !then.map_or(crowded, |s| now.resident(s)) {
                now.counter = now.counter.wrapping_add(1);
            }
            self.list_holder(
                e,
                listed,
                Holder {
                    slot: tag,
                    stamp: now.counter,
                },
                slots,
            );
            walk.hint = self.entries[e as usize].prev;
        }
        self.splice_front(walk.run);
        slots.counter[slot] = now.counter;
        before
    }

    /// The common case of a touch, as a loop of its own so that a block costs a few dozen
    /// instructions: walking back from block `i` (exclusive), each block that is the hint (the
    /// list predecessor of the block just visited), lies just before the run being moved, and
    /// lists `tag` with a stamp `now` still takes for resident is only restamped and joins the
    /// run, exactly as the general path would do it (no counter advance, no holder displaced,
    /// nothing crowded); `noted(block, stamp before)` is told of each. Stops at the first block
    /// that is not such a block, or at block `lo`, and returns its index + 1 (`lo`: all of
    /// them were). A prompt sent before is mostly this: a 256 KiB one is 2,048 blocks, walked
    /// on every request.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn extend_run(
        &mut self,
        chain: &[u64],
        mut i: usize,
        lo: usize,
        tag: u16,
        now: SlotView,
        walk: &mut ListWalk,
        mut noted: impl FnMut(usize, u32),
    ) -> usize {
        let Some((mut first, last)) = walk.run else {
            return i;
        };
        // `now.resident(stamp)`, with what does not change during the loop taken out.
        let limit = now.capacity.min(now.distance(now.forgotten_at));
        // The entry to read next: first the hint (the list predecessor of the block visited
        // last), then not the predecessor read from the entry just visited but the entry after
        // it in the slab. A chain sent at once was inserted last block first into consecutive
        // places, so that is usually the same entry, and its address does not wait for a load:
        // following `prev` made each block's read wait for the one before (a chain of cache
        // misses on a large index); this lets the processor read ahead. A wrong guess fails the
        // `next` test (an entry whose successor is `first` is `first`'s predecessor), and the
        // block is read again from the address `prev` gave (`known`). Ending the loop there
        // instead, for the general path, doubled the instructions of a chain built a few blocks
        // at a time between other chains' (an agent's history; `grown` in the cache_aware
        // bench's DISPATCH_LOOP).
        let mut e = walk.hint;
        // The list predecessor of `first`, read from its entry: where a guess goes wrong.
        let mut known = e;
        while i > lo {
            let Some(&hash) = chain.get(i - 1) else {
                break;
            };
            let Some(entry) = self.entries.get_mut(e as usize) else {
                break;
            };
            if entry.next != first {
                if e == known {
                    break;
                }
                // A wrong guess: the same block again, from its predecessor's real address.
                e = known;
                continue;
            }
            if entry.hash != hash {
                break;
            }
            let Some(p) = entry.holders.position(tag) else {
                break;
            };
            let then = entry.holders.stamp[p];
            if now.distance(then) >= limit {
                break;
            }
            entry.holders.stamp[p] = now.counter;
            known = entry.prev;
            i -= 1;
            noted(i, then);
            first = e;
            e = e.wrapping_add(1);
        }
        walk.run = Some((first, last));
        // The hint: the list predecessor of the block visited last (the run's first entry).
        walk.hint = self.entries.get(first as usize).map_or(NIL, |x| x.prev);
        i
    }

    /// The entry of block `hash` during a touch, found or added, its place on the LRU list
    /// settled as far as `walk` allows.
    fn visit(&mut self, hash: u64, walk: &mut ListWalk) -> u32 {
        // `lookup_near` written out: the call here measured 700 more instructions per 16 KiB
        // request in `serve` (callgrind), on the path every block of every request takes.
        let hint = walk.hint;
        let found = if hint != NIL && self.entries[hint as usize].hash == hash {
            Some(hint)
        } else {
            self.lookup(hash)
        };
        match found {
            // Just before the run on the list: it joins it.
            Some(e)
                if walk
                    .run
                    .is_some_and(|(first, _)| self.entries[e as usize].next == first) =>
            {
                walk.run = walk.run.map(|(_, last)| (e, last));
                e
            }
            Some(e) => {
                self.splice_front(walk.run);
                walk.run = Some((e, e));
                e
            }
            None => {
                // What was visited goes to the front first: the budget evicts from the tail.
                self.splice_front(walk.run.take());
                let e = self.insert(hash);
                self.push_front(e);
                e
            }
        }
    }

    /// Lists `holder` on entry `e`: in its own place (`listed`), else an empty one, else the
    /// one its instance cached longest ago. Displacing an instance that still holds the block
    /// makes the block crowded. Only the new holder's instance's counter moved during the touch,
    /// so `slots` still holds every other instance's.
    fn list_holder(&mut self, e: u32, listed: Option<usize>, holder: Holder, slots: &Slots) {
        let holders = &mut self.entries[e as usize].holders;
        let at = listed
            .or_else(|| holders.position(0))
            .unwrap_or_else(|| oldest(holders, slots));
        let displaced = holders.get(at);
        holders.set(at, holder);
        if displaced.slot != 0
            && displaced.slot != holder.slot
            && slots.resident(usize::from(displaced.slot - 1), displaced.stamp)
        {
            self.set_crowded(e, true);
        }
    }

    /// Whether block `hash` is listed at all (sent to some instance and not yet dropped from
    /// the budget, resident there or not).
    pub fn contains(&self, hash: u64) -> bool {
        self.lookup(hash).is_some()
    }

    /// Drops `slot` from every block of `chain` (the engine said it does not hold them).
    pub fn remove_holder(&mut self, chain: &[u64], slot: usize) {
        let tag = slot as u16 + 1;
        for h in chain {
            if let Some(e) = self.lookup(*h) {
                let holders = &mut self.entries[e as usize].holders;
                for k in 0..HOLDERS {
                    if holders.slot[k] == tag {
                        holders.set(k, Holder::default());
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
            holders: Holders::default(),
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
fn oldest(holders: &Holders, slots: &Slots) -> usize {
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
mod tests;
