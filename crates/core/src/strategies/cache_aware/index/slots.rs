//! What the index knows of each instance's cache: how many blocks it was sent (its counter),
//! how many it is estimated to hold, and when it was last forgotten. A block's stamp is the
//! instance's counter when the block was last sent there; these say whether that stamp is
//! still resident (see [the index](super)).

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
    pub(super) fn view(&self, slot: usize) -> Option<SlotView> {
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
    pub(super) fn resident(&self, slot: usize, stamp: u32) -> bool {
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
pub(super) struct SlotView {
    pub(super) counter: u32,
    pub(super) capacity: u32,
    pub(super) forgotten_at: u32,
}

impl SlotView {
    pub(super) fn distance(self, stamp: u32) -> u32 {
        self.counter.wrapping_sub(stamp)
    }
    /// Stamped since the instance was last forgotten.
    pub(super) fn known(self, stamp: u32) -> bool {
        self.distance(stamp) < self.distance(self.forgotten_at)
    }
    /// Known and within the estimated capacity.
    pub(super) fn resident(self, stamp: u32) -> bool {
        self.distance(stamp) < self.capacity && self.known(stamp)
    }
}

/// What the index had for an instance before [`BlockIndex::touch`](super::BlockIndex::touch) sent it a chain.
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
    pub(super) fn note(&mut self, i: usize, from: usize, then: Option<u32>, start: SlotView) {
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
