//! The walk that finds, for each instance, how many leading blocks of a chain it holds.

use super::{BlockIndex, Keys, Slots, HOLDERS, NIL};

/// How many of a chain's last blocks [`BlockIndex::longest_matches`] looks at first: a prompt
/// sent before often comes back with a little new after it (a document with a short question),
/// up to 3 blocks (384 characters at the default block) nobody was sent. More new text than
/// that (a conversation's next turn, with the reply and the next message) is left to the
/// gallop.
const TAIL_PROBES: usize = 4;

impl BlockIndex {
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
    /// deepest of the chain's last `TAIL_PROBES` (4) blocks that is tracked at all (not crowded)
    /// holds every block up to it and none after, so it is matched that far where the walk
    /// reaches it, and the gallop goes on only for the others. Without it, a 256 KiB prompt's
    /// revisit galloped over its 2,048 blocks in about 21 probes, each a table slot and an
    /// entry at random places: in `serve`, with the index out of the processor's caches, about
    /// 7 µs of its decision. Looked up once some slot holds the first block: a prompt nobody
    /// was sent costs no more than before, but a new one behind a shared opening pays up to
    /// `TAIL_PROBES` (4) more table probes (that find nothing).
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
    pub fn longest_matches<'a>(
        &self,
        chain: impl Into<Keys<'a>>,
        slots: &Slots,
        matched: &mut [u32],
    ) {
        let chain = chain.into();
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
            let Some(e) = self.lookup_near(chain.at(i), hint) else {
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
            let holds = |j: usize| self.held_by_all(chain.at(j), &went, slots);
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

    /// The deepest of the last `TAIL_PROBES` (4) blocks of `chain` that is tracked (its index + 1;
    /// 0 when none is), and the slots (at most [`HOLDERS`]; `usize::MAX` for none) listed on it
    /// with a resident stamp, unless it is crowded: they hold the chain up to it, and nobody
    /// holds the blocks after it (see [`BlockIndex::longest_matches`]). Slots from `slots_len`
    /// on are left out.
    fn deepest_holders(
        &self,
        chain: Keys<'_>,
        slots: &Slots,
        slots_len: usize,
    ) -> (u32, [usize; HOLDERS]) {
        let mut deep = [usize::MAX; HOLDERS];
        for j in (chain.len().saturating_sub(TAIL_PROBES)..chain.len()).rev() {
            let Some(e) = self.lookup(chain.at(j)) else {
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
}
