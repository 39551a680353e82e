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
//! Blocks are keyed by their chain hash mixed with the requested model's ([`Keys`]): an engine
//! does not share a prefix's KV between a base model and its LoRA adapters, or between two
//! adapters (vLLM keys a block by its adapter too), so equal text sent for different models is
//! different blocks here as well. Without it, a prompt sent for adapter `a` made a request for
//! adapter `b` with the same prompt look cached where it was not, and the engine's report of 0
//! cached tokens then shrank that instance's estimated cache (see `correct` in the strategy).
//! Traffic that names one model (or none) is keyed exactly as before, up to the mix, which no
//! decision reads.
//!
//! Bytes per tracked block: one [`Entry`] (40 B) plus 2-4 slots of the [table](super::table)
//! (4 B each: a power of two of at least twice the budget, fixed at creation), so 48 B at the
//! default budget of 1 Mi blocks: 48 MiB once full, and never more. See [`BlockIndex::bytes`].

use super::table::BlockTable;

mod slots;
mod walk;

use slots::SlotView;
pub use slots::{Before, Slots};

/// A request's block chain as the index keys it: each hash mixed with the requested model's (see
/// the module documentation). A model of `None` (the native API, a body without one) mixes in
/// nothing.
#[derive(Debug, Clone, Copy)]
pub struct Keys<'a> {
    chain: &'a [u64],
    mix: u64,
}

impl<'a> Keys<'a> {
    /// `chain` as requested for `model`.
    pub fn new(chain: &'a [u64], model: Option<&str>) -> Self {
        Self {
            chain,
            mix: model.map_or(0, model_mix),
        }
    }
    /// Blocks in the chain.
    #[inline]
    pub fn len(&self) -> usize {
        self.chain.len()
    }
    /// Whether the chain has no block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }
    /// Block `i`'s key.
    #[inline]
    pub fn at(&self, i: usize) -> u64 {
        self.chain[i] ^ self.mix
    }
    /// The first block's key.
    pub fn first(&self) -> Option<u64> {
        self.chain.first().map(|h| h ^ self.mix)
    }
}

/// A chain with no model mixed in (tests, and callers that key by text alone).
impl<'a, C: AsRef<[u64]> + ?Sized> From<&'a C> for Keys<'a> {
    fn from(chain: &'a C) -> Self {
        Self {
            chain: chain.as_ref(),
            mix: 0,
        }
    }
}

/// What a model's name mixes into its blocks' keys: never 0 (0 is no model), so a block hash
/// `h` becomes `h ^ mix`, a different key for every model and the same for every request naming
/// it (router replicas agree).
fn model_mix(model: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(model.as_bytes(), MODEL_SEED) | 1
}

/// Seed of [`model_mix`] (any fixed value: replicas must agree on it).
const MODEL_SEED: u64 = 0x6d6f_6465_6c5f_6d69;

/// Instances tracked per block. A block held by more instances keeps the most recent ones.
pub const HOLDERS: usize = 4;

const NIL: u32 = u32::MAX;

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

    /// Records that every block of `chain` was sent to `slot` now: each becomes the most recently
    /// used (the head most of all), and blocks the instance did not (probably) hold advance its
    /// counter. Returns what the index had for `slot` before, past block `from` (the blocks a
    /// decision predicted cached): read in the same pass, so a decision looks each block up
    /// once.
    pub fn touch<'a>(
        &mut self,
        chain: impl Into<Keys<'a>>,
        slot: usize,
        slots: &mut Slots,
        from: usize,
    ) -> Before {
        let chain = chain.into();
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
            let h = chain.at(i);
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
        chain: Keys<'_>,
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
        let (raw, mix) = (chain.chain, chain.mix);
        while i > lo {
            let Some(&h) = raw.get(i - 1) else {
                break;
            };
            let hash = h ^ mix;
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
        // That is `known`; read again rather than kept, because keeping it live past the loop
        // cost about 2 instructions a block in the loop (bench/dispatch-instructions.sh).
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
    pub fn remove_holder<'a>(&mut self, chain: impl Into<Keys<'a>>, slot: usize) {
        let chain = chain.into();
        let tag = slot as u16 + 1;
        for i in 0..chain.len() {
            if let Some(e) = self.lookup(chain.at(i)) {
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
